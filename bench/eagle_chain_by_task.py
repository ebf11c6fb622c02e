#!/usr/bin/env python3
"""Per-task table of tools/train/eagle_chain_reference.py's "simulated_run" (a greedy speculative
run with a chain of --depth drafts, as bench-spec counts it: acceptance by depth = share of steps
whose first j drafts were all accepted; mean accepted drafts per step; tokens per step = that + 1).

Usage: eagle_chain_by_task.py --prompts P.jsonl --dump DUMP LABEL=chain.json [LABEL=chain.json ...]
  P.jsonl: the prompts the dump was made from (each line's "task"); DUMP/index.json maps the
  dump's sequences to prompt lines.
"""
import argparse
import json
import os


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", required=True)
    ap.add_argument("--dump", required=True)
    ap.add_argument("runs", nargs="+", help="LABEL=chain_reference_output.json")
    a = ap.parse_args()
    tasks = [json.loads(line).get("task", "?") for line in open(a.prompts) if line.strip()]
    seqs = json.load(open(os.path.join(a.dump, "index.json")))["sequences"]
    task_of = [tasks[s["line"] - 1] for s in seqs]
    order = list(dict.fromkeys(task_of))
    print("| head | task | steps | acceptance by depth 1 / 2 / 3 / 4 | mean accepted drafts / step | tokens / step |")
    print("|---|---|---|---|---|---|")
    for run in a.runs:
        label, path = run.split("=", 1)
        r = json.load(open(path))
        sim = r["simulated_run"]
        D = r["depth"]
        for t in order + ["all"]:
            rows = [p for p in sim["per_sequence"] if t == "all" or task_of[p["sequence"]] == t]
            steps = sum(p["steps"] for p in rows)
            acc = [sum(p["accepted_per_pos"][j] for p in rows) / max(1, steps) for j in range(D)]
            mean = sum(p["accepted"] for p in rows) / max(1, steps)
            print(f"| {label} | {t} | {steps} | {' / '.join(f'{x:.3f}' for x in acc)} | {mean:.3f} | {mean + 1:.3f} |")


if __name__ == "__main__":
    main()
