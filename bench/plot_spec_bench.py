#!/usr/bin/env python3
"""Plots a `specserve bench-spec --output X.json` result: speedup per task and method, and
acceptance by draft position (fraction of drafts whose token at position i was accepted).

Command: $(scripts/venv.sh --with-plot) bench/plot_spec_bench.py bench/results/spec_bench_<date>.json
Writes <input>.png next to the JSON.

A/B of two builds (each run's speedup is against its own file's baseline):
  bench/plot_spec_bench.py A.json B.json --labels "rule A" "rule B" --output AB.png
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

TASKS = ["mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag"]


def short_name(name):
    """A legend label for a run: its --spec JSON shortened to method, k, tree shape, draft_p_min, prompt lookup
    first, lookup history, fixed k (adaptive_k false), and the head file's name when it is not in models/heads/."""
    if not name.startswith("{"):
        return name
    try:
        s = json.loads(name)
    except ValueError:
        return name[:40]
    if not isinstance(s, dict):
        return name[:40]
    s = {k: v for k, v in s.items() if v is not None}  # null is not given (as bench-spec reads it)
    parts = [s.get("method", "?"), f"k={s.get('num_speculative_tokens', '?')}"]
    if "eagle_topk" in s or "eagle_depth" in s:
        topk, depth = s.get("eagle_topk"), s.get("eagle_depth")
        parts.append("chain" if topk == 1 else f"tree topk {topk} depth {depth}")
    if "speculative_token_tree" in s:
        parts.append("tree " + s["speculative_token_tree"].replace(" ", ""))
    if "num_layers" in s:
        parts.append(f"{s['num_layers']} layers")
    if "draft_p_min" in s:
        parts.append(f"p_min {s['draft_p_min']}")
    if s.get("adaptive_k") is False:
        parts.append("fixed k")
    if s.get("method") != "ngram" and ("prompt_lookup_min" in s or "prompt_lookup_max" in s):
        lo = s.get("prompt_lookup_min", s.get("prompt_lookup_max"))
        hi = s.get("prompt_lookup_max", lo)
        parts.append(f"+ lookup first {lo}..{hi}")  # spec/lookup_first_proposer.h
    if s.get("lookup_cached_requests"):
        parts.append(f"+ history {s['lookup_cached_requests']}")  # spec/lookup_history.h
    model = s.get("model", "")
    if model and s.get("method") in ("medusa", "eagle") and not ("/" + model).count("/models/heads/"):
        parts.append("[" + model.rsplit("/", 1)[-1].removesuffix(".gguf") + "]")  # which head file
    return " ".join(parts)


def parse_args(argv):
    """(paths, labels, output): labels are given for every path or for none."""
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        sys.exit(0 if argv else 2)
    # JSON paths first, then --labels L... (one per path) and/or --output PNG, in either order.
    paths, labels, output, mode = [], [], None, "paths"
    for a in argv:
        if a in ("--labels", "--output"):
            mode = a
        elif mode == "--labels":
            labels.append(a)
        elif mode == "--output":
            if output is not None:
                sys.exit(f"plot_spec_bench.py: '{a}' after --output {output}: put the JSON paths first")
            output = a
        else:
            paths.append(a)
    if mode == "--output" and output is None:
        sys.exit("plot_spec_bench.py: --output needs a PNG path")
    if not paths or (len(paths) > 1 and (not output or len(labels) != len(paths))) or (len(paths) == 1 and labels and len(labels) != 1):
        sys.exit("plot_spec_bench.py: give one JSON, or several followed by --labels (one per JSON) and --output PNG")
    return paths, labels, output or paths[0].rsplit(".", 1)[0] + ".png"


def main():
    paths, labels, out = parse_args(sys.argv[1:])
    runs = []
    for i, path in enumerate(paths):
        for r in json.load(open(path))["runs"]:
            if r["name"] == "baseline":
                continue
            r = dict(r)
            r["label"] = short_name(r["name"]) + (f" [{labels[i]}]" if labels else "")
            runs.append(r)
    batches = sorted({r["batch"] for r in runs})
    fig, axes = plt.subplots(len(batches), 2, figsize=(14, 5.5 * len(batches)), squeeze=False)
    for row, b in enumerate(batches):
        rb = [r for r in runs if r["batch"] == b]
        ax = axes[row][0]
        width = 0.8 / max(1, len(rb))
        for i, r in enumerate(rb):
            xs = [t + i * width for t in range(len(TASKS) + 1)]
            ys = [r.get("tasks", {}).get(t, {}).get("speedup", 0) for t in TASKS] + [r["overall"]["speedup"]]
            ax.bar(xs, ys, width, label=r["label"])
        ax.axhline(1.0, color="black", lw=0.8)
        ax.set_xticks([t + 0.4 - width / 2 for t in range(len(TASKS) + 1)])
        ax.set_xticklabels(TASKS + ["overall"], rotation=20)
        ax.set_ylabel("decode speedup vs. no speculation")
        ax.set_title(f"Spec-Bench, batch {b}, greedy")
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2)
        ax = axes[row][1]
        for r in rb:
            o = r["overall"]
            n = max(1, o["num_drafts"])
            pos = o.get("accepted_per_pos", [])
            if pos:
                ax.plot(range(1, len(pos) + 1), [p / n for p in pos], marker="o", label=r["label"])
        ax.set_xlabel("draft position")
        ax.set_ylabel("fraction of drafts accepted up to this position")
        ax.set_ylim(0, 1)
        ax.set_title(f"Acceptance by position, batch {b}")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=90)
    print(out)


if __name__ == "__main__":
    main()
