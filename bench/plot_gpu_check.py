#!/usr/bin/env python3
"""Plots one tools/gpu-check.sh run (its results folder) into OUT.png, two panels:
  left:  decode tokens/s against batch size for each bench_model_*.json (synthetic Llama shapes;
         CUDA graphs on, --enforce-eager, the batch-invariant matmul), log scale;
  right: decode tokens/s of bench-spec's methods (baseline, n-gram, layer_skip) on the default
         model, CUDA graphs on beside --enforce-eager and beside attention's split over the keys
         off (bench_spec.json, bench_spec_eager.json, bench_spec_no_split.json; those present).
Every bar and point is a figure the run measured; nothing is derived but the ratios in the title.

Command: $(scripts/venv.sh --with-plot) bench/plot_gpu_check.py --results DIR --out OUT.png
"""
import argparse
import glob
import json
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def load(path):
    with open(path) as f:
        return json.load(f)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--results", required=True, help="a gpu-check results folder (its JSON files)")
    ap.add_argument("--out", required=True, help="the PNG to write")
    ap.add_argument("--title", default="specserve on one GPU (tools/gpu-check.sh)")
    a = ap.parse_args()

    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 5))
    for path in sorted(glob.glob(os.path.join(a.results, "bench_model_*.json"))):
        r = load(path)
        label = os.path.basename(path)[len("bench_model_"):-len(".json")]
        g = r.get("cuda_graphs")
        if g is not None and not g.get("enabled", True):
            label += " (graphs off)"
        pts = sorted((int(b), d["tokens_per_s"]) for b, d in r.get("decode", {}).items())
        left.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=label)
    left.set_xscale("log", base=2)
    left.set_yscale("log")
    left.set_xlabel("decode batch size (sequences)")
    left.set_ylabel("decode tokens/s")
    left.set_title("bench-model: synthetic Llama shapes, bf16 weights")
    left.grid(True, which="both", alpha=0.3)
    left.legend(fontsize=8)

    runs = {}
    for name, key in (("bench_spec.json", "CUDA graphs"), ("bench_spec_eager.json", "--enforce-eager"),
                      ("bench_spec_no_split.json", "graphs, attention split off")):
        p = os.path.join(a.results, name)
        if os.path.exists(p):
            runs[key] = {x["name"]: x["overall"]["decode_tokens_per_s"] for x in load(p)["runs"] if x.get("batch") == 1}
    if runs:
        methods = list(next(iter(runs.values())).keys())
        short = [m if len(m) < 20 else (json.loads(m).get("method") or m) for m in methods]
        width = 0.8 / len(runs)
        for i, (key, vals) in enumerate(runs.items()):
            xs = [j + (i - (len(runs) - 1) / 2) * width for j in range(len(methods))]
            have = [(x, vals[m]) for x, m in zip(xs, methods) if m in vals]
            bars = right.bar([h[0] for h in have], [h[1] for h in have], width, label=key)
            right.bar_label(bars, fmt="%.0f", fontsize=8)
        right.set_xticks(range(len(methods)))
        right.set_xticklabels(short)
        right.set_ylabel("decode tokens/s (batch 1, greedy)")
        right.set_title("bench-spec: default model (SmolLM2-135M), Spec-Bench,\n1 question per task, 64 tokens")
        right.legend(fontsize=8)
        right.grid(True, axis="y", alpha=0.3)
    fig.suptitle(a.title)
    fig.tight_layout()
    fig.savefig(a.out, dpi=120)
    print(a.out)


if __name__ == "__main__":
    main()
