#!/usr/bin/env python3
"""Plots `specserve bench-model --verify-rows ...` results: the time of one sequence's
verification step of N chain rows as a multiple of its 1-row step, one line per input file
(e.g. one per CPU matmul kernel), beside the line y = N: the most tokens a step of N rows can
yield (every draft accepted). A step of N rows pays only when it yields more than ratio(N)
tokens on average, i.e. accepts more than ratio(N) - 1 drafts (before the proposer's own cost).
Writes OUT.png and OUT.md (the table).

Command: $(scripts/venv.sh --with-plot) bench/plot_verify_rows.py A.json [B.json ...] --out OUT
"""
import argparse
import json

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("inputs", nargs="+", help="bench-model --output files with a 'verify' section")
    ap.add_argument("--out", required=True, help="output prefix (OUT.png, OUT.md)")
    ap.add_argument("--labels", nargs="+", help="one label per input, put before its kernel and context")
    a = ap.parse_args()
    if a.labels and len(a.labels) != len(a.inputs):
        raise SystemExit(f"--labels: {len(a.labels)} labels for {len(a.inputs)} inputs")
    runs = []
    for k, path in enumerate(a.inputs):
        try:
            with open(path) as f:
                j = json.load(f)
        except (OSError, ValueError) as e:
            raise SystemExit(f"{path}: cannot read a bench-model JSON ({e})")
        if "verify" not in j:
            raise SystemExit(f"{path}: no 'verify' section (run bench-model with --verify-rows)")
        rows = sorted(int(k) for k in j["verify"])
        label = f"{j.get('cpu_matmul', j.get('device', '?'))} kernel, {j.get('decode_context', '?')} cached"
        if a.labels:
            label = f"{a.labels[k]}: {label}"
        runs.append((label, rows, [j["verify"][str(n)]["ratio_to_one_row"] for n in rows],
                     [j["verify"][str(n)]["ms_per_step"] for n in rows], path))
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for label, rows, ratio, _, _ in runs:
        ax.plot(rows, ratio, marker="o", label=label)
    top = max(max(r[1]) for r in runs)
    ax.plot([1, top], [1, top], color="grey", linestyle="--", linewidth=1, label="y = N: tokens a step of N rows yields at most")
    ax.set_xlabel("rows in the verification step (1 + drafted tokens)")
    ax.set_ylabel("step time / 1-row step")
    ax.set_title("Cost of a verification step (one sequence)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(a.out + ".png", dpi=110)
    with open(a.out + ".md", "w") as f:
        f.write("| input | kernel and context | rows | ms per step | / 1-row step |\n|---|---|---|---|---|\n")
        for label, rows, ratio, ms, path in runs:
            for n, r, m in zip(rows, ratio, ms):
                f.write(f"| {path.split('/')[-1]} | {label} | {n} | {m:.2f} | {r:.2f}x |\n")
    print(f"wrote {a.out}.png and {a.out}.md")


if __name__ == "__main__":
    main()
