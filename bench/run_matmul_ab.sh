#!/usr/bin/env bash
# The CPU matmul kernels A/B (cpu/matmul.h): AVX2 (8 lanes) against AVX-512 (16 lanes, 8 x rows x
# 3 weight rows per tile), in one session, interleaved, on the default model:
#   1. bench-model decode step time at 1, 3, 5, 9 and 16 rows per step (a verification step of k
#      drafts is k + 1 rows; batched decode is one row per sequence), REPEATS runs each, twice per
#      kernel in the order avx2, avx512, avx2, avx512; the mean of the two runs is reported;
#   2. bench-spec on Spec-Bench, batch 1 (2 questions per task, 64 tokens), baseline, n-gram and
#      the committed EAGLE head as chain and tree, once per kernel.
# Writes bench/results/cpu_matmul_ab_<date>.{json,md,png}. Needs a CPU with avx512f.
# Usage: bench/run_matmul_ab.sh [THREADS] [REPEATS]     (--help: this text)
set -euo pipefail
if [ "${1:-}" = "--help" ] || [ "${1:-}" = "-h" ]; then sed -n "2,10p" "$0" | sed 's/^# \{0,1\}//'; exit 0; fi
here="$(cd "$(dirname "$0")/.." && pwd)"
threads="${1:-$(nproc)}"
repeats="${2:-5}"
grep -q avx512f /proc/cpuinfo || { echo "bench/run_matmul_ab.sh: this CPU has no avx512f: nothing to compare" >&2; exit 2; }
model="$("$here/scripts/fetch-model.sh" | tail -n 1)"
"$here/scripts/build.sh"
py="$("$here/scripts/venv.sh" --with-plot)"
day="$(date +%Y-%m-%d)"
out="$here/bench/results/cpu_matmul_ab_$day"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
for round in 1 2; do
  for isa in avx2 avx512; do
    echo "[matmul-ab] bench-model, $isa, round $round of 2" >&2
    SPECSERVE_CPU_MATMUL=$isa "$here/build/bin/specserve" bench-model --model "$model" --threads "$threads" \
      --decode-batches 1 3 5 9 16 --prompt-lengths 128 --decode-tokens 32 --repeats "$repeats" \
      --output "$tmp/model_${isa}_$round.json" >/dev/null
  done
done
eagle="$here/models/heads/eagle-smollm2-135m.gguf"
specs=(
  --spec '{"method":"ngram","num_speculative_tokens":4,"prompt_lookup_min":1,"prompt_lookup_max":5}'
  --spec "{\"method\":\"eagle\",\"model\":\"$eagle\",\"num_speculative_tokens\":8,\"eagle_topk\":4,\"eagle_depth\":4,\"draft_vocab_size\":8192}"
  --spec "{\"method\":\"eagle\",\"model\":\"$eagle\",\"num_speculative_tokens\":2,\"eagle_topk\":1,\"eagle_depth\":2,\"draft_vocab_size\":8192}"
)
for isa in avx2 avx512; do
  echo "[matmul-ab] bench-spec (Spec-Bench, batch 1), $isa" >&2
  SPECSERVE_CPU_MATMUL=$isa "$here/build/bin/specserve" bench-spec --model "$model" --threads "$threads" --per-task 2 \
    --max-tokens 64 --batch-sizes 1 "${specs[@]}" --output "$tmp/spec_$isa.json" > "$tmp/spec_$isa.md"
done
"$py" - "$tmp" "$out" "$threads" "$repeats" <<'PY'
import json, statistics, sys
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
tmp, out, threads, repeats = sys.argv[1:]
isas = ["avx2", "avx512"]
rows = ["1", "3", "5", "9", "16"]
step = {i: {r: statistics.mean(json.load(open(f"{tmp}/model_{i}_{k}.json"))["decode"][r]["ms_per_step"] for k in (1, 2))
            for r in rows} for i in isas}
spec = {i: json.load(open(f"{tmp}/spec_{i}.json")) for i in isas}
for i in isas:
    assert spec[i]["cpu_matmul"] == i, (i, spec[i]["cpu_matmul"])
    for k in (1, 2):
        got = json.load(open(f"{tmp}/model_{i}_{k}.json"))["cpu_matmul"]
        assert got == i, (i, k, got)
def label(name):
    if not name.startswith("{"):
        return name
    s = json.loads(name)
    parts = [s["method"], f"k={s.get('num_speculative_tokens')}"]
    if "eagle_topk" in s:
        parts.append(f"topk {s['eagle_topk']} depth {s['eagle_depth']}")
    return " ".join(parts)
def methods(rep):
    return {label(run["name"]): run["overall"] for run in rep["runs"]}
ms = {i: methods(spec[i]) for i in isas}
L = [f"# CPU matmul kernels: AVX2 against AVX-512, {out.rsplit('_', 1)[-1]}", "",
     f"Command: `bench/run_matmul_ab.sh {threads} {repeats}` (one session, {threads} threads, default model).", "",
     "## Decode step time by rows per step (bench-model: mean of 2 runs, each the median of " + repeats + ")", "",
     "| rows per step | AVX2 ms | AVX-512 ms | AVX-512 / AVX2 | AVX2: x the 1-row step | AVX-512: x the 1-row step |", "|---|---|---|---|---|---|"]
for r in rows:
    a, b = step["avx2"][r], step["avx512"][r]
    L.append(f"| {r} | {a:.1f} | {b:.1f} | {b / a:.2f} | {a / step['avx2']['1']:.2f} | {b / step['avx512']['1']:.2f} |")
L += ["", "## Spec-Bench, batch 1, greedy (bench-spec; speedup against each kernel's own baseline)", "",
      "| method | AVX2 speedup | AVX-512 speedup | AVX2 decode tokens/s | AVX-512 decode tokens/s | mean accepted tokens (AVX2 / AVX-512) | greedy mismatches (AVX2 / AVX-512) |",
      "|---|---|---|---|---|---|---|"]
def g(m, *keys):
    for k in keys:
        if k in m:
            return m[k]
    return None
for name in ms["avx2"]:
    a, b = ms["avx2"][name], ms["avx512"].get(name, {})
    L.append(f"| {name} | {g(a, 'speedup') or 0:.2f}x | {g(b, 'speedup') or 0:.2f}x | "
             f"{g(a, 'decode_tokens_per_s') or 0:.1f} | {g(b, 'decode_tokens_per_s') or 0:.1f} | "
             f"{g(a, 'mean_accepted_tokens') or 0:.2f} / {g(b, 'mean_accepted_tokens') or 0:.2f} | "
             f"{g(a, 'greedy_mismatches')} / {g(b, 'greedy_mismatches')} |")
open(out + ".md", "w").write("\n".join(L) + "\n")
json.dump({"decode_ms_per_step": step, "spec_bench_b1": spec}, open(out + ".json", "w"), indent=1)
fig, ax = plt.subplots(figsize=(6, 4))
for i in isas:
    ax.plot([int(r) for r in rows], [step[i][r] for r in rows], marker="o", label=i)
ax.set_xlabel("rows per decode step"); ax.set_ylabel("ms per step"); ax.set_ylim(bottom=0); ax.legend(); ax.grid(alpha=0.3)
ax.set_title("specserve CPU decode step: AVX2 vs AVX-512 matmul")
fig.tight_layout(); fig.savefig(out + ".png", dpi=120)
print("\n".join(L))
PY
