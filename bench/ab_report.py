"""Report of an interleaved A/B (bench/run_cpu_ab.sh, bench/run_rev_ab.sh): reads the bench-model
and bench-spec JSON of each setting and round from TMP (model_<A|B>_<round>.json,
spec_<A|B>_<round>.json) and writes OUT.md (tables), OUT.json (the figures and every run) and
OUT.png (step time by rows; Spec-Bench decode tokens/s).

Usage: ab_report.py TMP OUT TITLE COMMAND A B THREADS REPEATS PER_TASK ROUNDS CONTEXT [KEY]
KEY: a bench JSON field that must equal the setting's name in every run (cpu_matmul, ...).
"""
import json, statistics, sys
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
tmp, out, title, command, va, vb, threads, repeats, per_task, rounds, context = sys.argv[1:12]
key = sys.argv[12] if len(sys.argv) > 12 else ""
vals, R = [va, vb], range(1, int(rounds) + 1)
rows = ["1", "3", "5", "9", "16"]
model = {v: [json.load(open(f"{tmp}/model_{v}_{r}.json")) for r in R] for v in vals}
spec = {v: [json.load(open(f"{tmp}/spec_{v}_{r}.json")) for r in R] for v in vals}
if key:  # the runs recorded the setting they were asked for
    for v in vals:
        for rep in model[v] + spec[v]:
            assert rep[key] == v, (key, v, rep[key])
step = {v: {r: statistics.mean(m["decode"][r]["ms_per_step"] for m in model[v]) for r in rows} for v in vals}
mb = {v: statistics.mean(m["decode"]["1"]["bytes_per_step"] for m in model[v]) / 1e6 for v in vals}
def label(name):
    if not name.startswith("{"):
        return name
    s = json.loads(name)
    parts = [s["method"], f"k={s.get('num_speculative_tokens')}"]
    if "eagle_topk" in s:
        parts.append(f"topk {s['eagle_topk']} depth {s['eagle_depth']}")
    if "draft_p_min" in s:
        parts.append(f"p_min {s['draft_p_min']}")
    return " ".join(parts)
by = {}
for v in vals:
    for rep in spec[v]:
        for run in rep["runs"]:
            by.setdefault(label(run["name"]), {}).setdefault(v, []).append(run["overall"])
def mean(m, v, k):
    xs = [o[k] for o in by[m].get(v, []) if o.get(k) is not None]
    return statistics.mean(xs) if xs else float("nan")
L = [f"# {title}, {out.rsplit('_', 1)[-1]}", "",
     f"Command: `{command}` (one session, {threads} threads, "
     f"default model; {rounds} interleaved round(s) per setting, means reported).", "",
     f"## Decode step time by rows per step (bench-model, {context} tokens cached; each figure the median of {repeats})", "",
     "Rows per step: sequences of one decode step, each attending to its own cached tokens.", "",
     f"Bytes of weights and KV read per 1-row step: {va} {mb[va]:.0f} MB, {vb} {mb[vb]:.0f} MB.", "",
     f"| rows per step | {va} ms | {vb} ms | {vb} / {va} | {va}: x its 1-row step | {vb}: x its 1-row step |", "|---|---|---|---|---|---|"]
for r in rows:
    a, b = step[va][r], step[vb][r]
    L.append(f"| {r} | {a:.1f} | {b:.1f} | {b / a:.2f} | {a / step[va]['1']:.2f} | {b / step[vb]['1']:.2f} |")
L += ["", f"## Spec-Bench, batch 1, greedy ({per_task} questions per task, 64 tokens; speed-up against each setting's own baseline)", "",
      f"| method | {va} decode tokens/s | {vb} decode tokens/s | {vb} / {va} | speed-up ({va} / {vb}) | mean accepted tokens ({va} / {vb}) | greedy mismatches ({va} / {vb}) |",
      "|---|---|---|---|---|---|---|"]
for m in by:
    a, b = mean(m, va, "decode_tokens_per_s"), mean(m, vb, "decode_tokens_per_s")
    mis = [sum(o.get("greedy_mismatches") or 0 for o in by[m].get(v, [])) for v in vals]
    L.append(f"| {m} | {a:.1f} | {b:.1f} | {b / a:.2f} | {mean(m, va, 'speedup'):.2f}x / {mean(m, vb, 'speedup'):.2f}x | "
             f"{mean(m, va, 'mean_accepted_tokens'):.2f} / {mean(m, vb, 'mean_accepted_tokens'):.2f} | {mis[0]} / {mis[1]} |")
open(out + ".md", "w").write("\n".join(L) + "\n")
json.dump({"title": title, "command": command, "values": vals, "decode_context": int(context), "decode_ms_per_step": step, "bench_model": model, "spec_bench_b1": spec},
          open(out + ".json", "w"), indent=1)
fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
for v in vals:
    ax1.plot([int(r) for r in rows], [step[v][r] for r in rows], marker="o", label=v)
ax1.set_xlabel("rows per decode step"); ax1.set_ylabel("ms per step"); ax1.set_ylim(bottom=0); ax1.legend(); ax1.grid(alpha=0.3)
ax1.set_title(f"decode step time, {context} tokens cached")
names = list(by)
for i, v in enumerate(vals):
    ax2.bar([j + (i - 0.5) * 0.4 for j in range(len(names))], [mean(m, v, "decode_tokens_per_s") for m in names], width=0.4, label=v)
ax2.set_xticks(range(len(names))); ax2.set_xticklabels(names, rotation=20, ha="right", fontsize=8)
ax2.set_ylabel("decode tokens/s (Spec-Bench b1)"); ax2.legend(); ax2.grid(alpha=0.3, axis="y")
fig.tight_layout(); fig.savefig(out + ".png", dpi=120)
print("\n".join(L))
