#!/usr/bin/env python3
"""Plots a `specserve bench-actors --out X.json` result: the control overhead of each actor path
against the Engine called directly at batch 1 (mean, with min..max over repeats as the error
bar), and output tokens/s against the number of concurrent clients (actor path and the direct
Engine with the same closed loop).

Command: $(scripts/venv.sh --with-plot) bench/plot_actor_bench.py bench/results/actors_<date>.json
Writes <input>.png next to the JSON.
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

LABELS = {"actor": "actors, one process", "network": "actors, worker process + loopback"}
COLORS = {"actor": "C0", "network": "C1"}


def plot_overhead(ax, report):
    blocks = report.get("overhead", [])
    # The units the Markdown table reports: the quiet ones when there were enough, else all.
    summaries = [b["summary_quiet"] if b.get("table_from") == "quiet units" else b["summary_all"] for b in blocks]
    paths = [p for p in ("actor", "network") if any(p in s for s in summaries)]
    width = 0.8 / max(1, 2 * len(paths))
    for i, p in enumerate(paths):
        for j, key in enumerate(("overhead_vs_direct", "decode_overhead_vs_direct")):
            xs, ys, lo, hi = [], [], [], []
            for k, b in enumerate(blocks):
                s = summaries[k].get(p)
                if not s:
                    continue
                sp = s[key]
                xs.append(k + (2 * i + j) * width)
                ys.append(100 * sp["mean"])
                lo.append(100 * (sp["mean"] - sp["min"]))
                hi.append(100 * (sp["max"] - sp["mean"]))
            label = LABELS[p] + (" (whole request)" if j == 0 else " (decode phase)")
            ax.bar(xs, ys, width, yerr=[lo, hi], capsize=3, label=label, color=COLORS[p],
                   alpha=1.0 if j == 0 else 0.6, hatch=None if j == 0 else "//")
    ax.axhline(0, color="black", lw=0.8)
    ax.axhline(3, color="red", lw=0.8, ls="--", label="aim: 3%")
    ax.set_xticks([k + (2 * len(paths) - 1) * width / 2 for k in range(len(blocks))])
    ax.set_xticklabels([f"speculation {b['speculation']}\n({b['table_from']}: {summaries[k][paths[0]]['units']} of "
                        f"{b['units']}; other processes {b['machine_during']['other_processes_cores']:.2f} cores)"
                        for k, b in enumerate(blocks)])
    ax.set_ylabel("wall time vs. direct Engine (%)")
    ax.set_title(f"Control overhead at batch 1, {report['max_tokens']} tokens, {report['threads']} threads\n"
                 "(bar: mean over repeats; whisker: min..max)")
    ax.legend(fontsize=7)


def plot_concurrency(ax, report):
    c = report.get("concurrency")
    if not c:
        ax.set_visible(False)
        return
    levels = c["levels"]
    xs = [lv["clients"] for lv in levels]
    name = c["path"]
    ax.plot(xs, [lv[name]["tokens_per_s"] for lv in levels], marker="o", label=LABELS.get(name, name))
    if all("direct" in lv for lv in levels):
        ax.plot(xs, [lv["direct"]["tokens_per_s"] for lv in levels], marker="s", ls="--", label="direct Engine, same loop")
    ax.set_xscale("log", base=2)
    ax.set_xticks(xs)
    ax.set_xticklabels([str(x) for x in xs])
    ax.set_xlabel("concurrent clients")
    ax.set_ylabel("output tokens/s (all clients)")
    ax.set_ylim(bottom=0)
    ax.set_title(f"Tokens/s vs clients, greedy, {report['sweep_max_tokens']} tokens per request\n"
                 f"(other processes: {c['machine_during']['other_processes_cores']:.2f} cores)")
    ax.legend(fontsize=7)


def main():
    if len(sys.argv) != 2 or sys.argv[1] in ("-h", "--help"):
        print(__doc__)
        sys.exit(0 if len(sys.argv) == 2 else 2)
    path = sys.argv[1]
    report = json.load(open(path))
    fig, axes = plt.subplots(1, 2, figsize=(14, 5))
    plot_overhead(axes[0], report)
    plot_concurrency(axes[1], report)
    fig.tight_layout()
    out = path.rsplit(".", 1)[0] + ".png"
    fig.savefig(out, dpi=90)
    print(out)


if __name__ == "__main__":
    main()
