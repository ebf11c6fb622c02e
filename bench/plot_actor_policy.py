#!/usr/bin/env python3
"""Plots `specserve bench-actors --mode overhead` results taken under different CAF scheduler
policies (SPECSERVE_CAF_SCHEDULER): overhead vs the direct Engine and context switches per step.
Usage: plot_actor_policy.py OUT.png LABEL=RESULT.json [LABEL=RESULT.json ...]"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main():
    if len(sys.argv) < 3 or sys.argv[1] in ("-h", "--help"):
        print(__doc__)
        sys.exit(0 if len(sys.argv) > 1 else 2)
    out = sys.argv[1]
    runs = [a.split("=", 1) for a in sys.argv[2:]]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    groups = []
    for label, path in runs:
        j = json.load(open(path))
        for o in j["overhead"]:
            s = o["summary_quiet"] if o["quiet_units"] * 2 >= o["units"] else o["summary_all"]
            for p in ("actor", "network"):
                if p in s:
                    groups.append((label, o["speculation"], p, s[p], s["direct"]))
    names = sorted({(g[1], g[2]) for g in groups})
    labels = [r[0] for r in runs]
    width = 0.8 / len(labels)
    for li, label in enumerate(labels):
        xs, ov, err_lo, err_hi, cs = [], [], [], [], []
        for ni, n in enumerate(names):
            for g in groups:
                if g[0] == label and (g[1], g[2]) == n:
                    o = g[3]["overhead_vs_direct"]
                    xs.append(ni + li * width)
                    ov.append(100 * o["mean"])
                    err_lo.append(100 * (o["mean"] - o["min"]))
                    err_hi.append(100 * (o["max"] - o["mean"]))
                    cs.append(g[3]["voluntary_context_switches_per_step"] + g[3]["involuntary_context_switches_per_step"])
        axes[0].bar(xs, ov, width, yerr=[err_lo, err_hi], capsize=3, label=label)
        axes[1].bar(xs, cs, width, label=label)
    ticks = [i + width * (len(labels) - 1) / 2 for i in range(len(names))]
    for ax in axes:
        ax.set_xticks(ticks)
        ax.set_xticklabels(["%s\n%s" % (("in-process" if p == "actor" else "worker process"), s) for s, p in names],
                           fontsize=8)
        ax.legend()
    axes[0].axhline(0, color="black", linewidth=0.8)
    axes[0].axhline(3, color="gray", linestyle="--", linewidth=0.8)
    axes[0].set_ylabel("overhead vs direct Engine, % (mean, min-max)")
    axes[0].set_title("Actor path at batch 1 (dashed: the 3% aim)")
    axes[1].set_ylabel("context switches / step (process tree)")
    axes[1].set_title("Context switches per engine step")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print(out)


if __name__ == "__main__":
    main()
