#!/usr/bin/env python3
"""Plots `specserve bench --output-json X.json` results: output tokens/s, TTFT p50 and TPOT p50
against the number of concurrent clients, one line per label (the system under test).

An input is one `specserve bench` JSON, or a file with a "results" list of them (what
bench/run_http_bench.sh writes). When a label has several results at one concurrency (repeated
rounds), the line goes through their median and a bar spans min..max.

Command: $(scripts/venv.sh --with-plot) bench/plot_http_bench.py [-o OUT.png] RESULT.json...
(default OUT: the first input with .png).
"""
import argparse
import json
import statistics
import sys
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

METRICS = [
    ("output_throughput", "output tokens/s", "Output token throughput"),
    ("median_ttft_ms", "TTFT p50 (ms)", "Time to first token, median"),
    ("median_tpot_ms", "TPOT p50 (ms)", "Time per output token, median"),
]


def load(paths):
    """Yields every bench result in the given files."""
    for path in paths:
        with open(path) as f:
            doc = json.load(f)
        if isinstance(doc, dict) and isinstance(doc.get("results"), list):
            yield from doc["results"]
        elif isinstance(doc, dict) and "runs" in doc:
            yield doc
        else:
            sys.exit(f"plot_http_bench.py: {path} is neither a `specserve bench` result nor a list of them")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("inputs", nargs="+", help="specserve bench JSON files")
    ap.add_argument("-o", "--output", help="PNG to write (default: the first input with .png)")
    args = ap.parse_args()
    out = args.output or (args.inputs[0].rsplit(".", 1)[0] + ".png")

    # label -> concurrency -> metric -> [values over results]
    data = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    settings = set()
    for res in load(args.inputs):
        label = res.get("label") or res.get("base_url", "?")
        settings.add((res.get("endpoint"), res.get("num_prompts"), res.get("max_tokens"), res.get("temperature")))
        for run in res["runs"]:
            if run.get("completed", 0) == 0:
                continue
            for key, _, _ in METRICS:
                data[label][run["max_concurrency"]][key].append(run[key])
    if not data:
        sys.exit("plot_http_bench.py: no completed run in the inputs")

    fig, axes = plt.subplots(1, len(METRICS), figsize=(5 * len(METRICS), 4.2))
    for ax, (key, ylabel, title) in zip(axes, METRICS):
        for i, (label, levels) in enumerate(sorted(data.items())):
            xs = sorted(levels)
            mids = [statistics.median(levels[c][key]) for c in xs]
            lo = [m - min(levels[c][key]) for m, c in zip(mids, xs)]
            hi = [max(levels[c][key]) - m for m, c in zip(mids, xs)]
            ax.errorbar(xs, mids, yerr=[lo, hi], marker="o", capsize=3, label=label, color=f"C{i}")
        ax.set_xscale("log", base=2)
        all_x = sorted({c for levels in data.values() for c in levels})
        ax.set_xticks(all_x)
        ax.set_xticklabels([str(c) for c in all_x])
        ax.set_xlabel("concurrent clients (--max-concurrency)")
        ax.set_ylabel(ylabel)
        ax.set_title(title, fontsize=10)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    desc = "; ".join(f"{e}, {n} prompts, max_tokens {m}, temperature {t}" for e, n, m, t in sorted(settings, key=str))
    fig.suptitle(f"specserve bench: {desc}", fontsize=9)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print(out)


if __name__ == "__main__":
    main()
