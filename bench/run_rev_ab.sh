#!/usr/bin/env bash
# A/B of two builds of specserve, in one session, interleaved, on the default model: REV_A and
# REV_B are git revisions of this repository (each exported and built, target specserve only, into
# ~/.cache/specserve/rev-ab/<commit>) or `worktree` (this checkout as it is, built by
# scripts/build.sh). The environment applies to both (e.g. SPECSERVE_CPU_MATMUL=vnni).
#   1. bench-model decode step time with CONTEXT tokens cached at 1, 3, 5, 9 and 16 sequences per
#      step, REPEATS runs each, ROUNDS times per build in the order A, B, A, B...; means reported;
#   2. bench-spec on Spec-Bench, batch 1, greedy (PER_TASK questions per task, 64 tokens): the
#      methods of bench/ab_specs.sh; ROUNDS times per build, interleaved.
# Writes bench/results/rev_<A>_vs_<B>_<date>[-<SPECSERVE_CPU_MATMUL>].{json,md,png} (A, B: short
# commit ids or `worktree`).
# Both builds must have bench-model --decode-context and bench-spec --questions (2026-12-05 on).
# Usage: bench/run_rev_ab.sh REV_A REV_B [THREADS] [REPEATS] [PER_TASK] [ROUNDS] [CONTEXT]   (--help: this text)
set -euo pipefail
shopt -s inherit_errexit  # a failed build inside $(binary_of ...) stops the script
if [ "${1:-}" = "--help" ] || [ "${1:-}" = "-h" ]; then sed -n "2,13p" "$0" | sed 's/^# \{0,1\}//'; exit 0; fi
if [ $# -lt 2 ]; then sed -n "2,13p" "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; fi
here="$(cd "$(dirname "$0")/.." && pwd)"
threads="${3:-$(nproc)}"
repeats="${4:-3}"
per_task="${5:-2}"
rounds="${6:-1}"
context="${7:-512}"
for n in "$threads" "$repeats" "$per_task" "$rounds" "$context"; do
  [[ "$n" =~ ^[1-9][0-9]*$ ]] || { echo "bench/run_rev_ab.sh: '$n' is not a positive whole number (THREADS REPEATS PER_TASK ROUNDS CONTEXT)" >&2; exit 2; }
done
export CCACHE_DIR="${CCACHE_DIR:-$HOME/.cache/ccache}" CCACHE_NOHASHDIR=true
cache="$HOME/.cache/specserve/rev-ab"
# label_of REV: `worktree` or the revision's short commit id; errors name the revision.
label_of() {
  if [ "$1" = worktree ]; then echo worktree; return; fi
  git -C "$here" rev-parse --verify --quiet "$1^{commit}" >/dev/null || { echo "bench/run_rev_ab.sh: '$1' is not a revision of this repository" >&2; exit 2; }
  git -C "$here" rev-parse --short "$1^{commit}"
}
# binary_of REV: builds it if needed and prints the specserve binary's path.
binary_of() {
  if [ "$1" = worktree ]; then "$here/scripts/build.sh" >&2; echo "$here/build/bin/specserve"; return; fi
  local sha src
  sha="$(git -C "$here" rev-parse "$1^{commit}")"
  src="$cache/$sha/src"
  if [ ! -x "$cache/$sha/build/bin/specserve" ]; then
    echo "[rev-ab] building $1 ($sha) into $cache/$sha" >&2
    rm -rf "$src" && mkdir -p "$src"
    git -C "$here" archive "$sha" | tar -x -C "$src"
    CCACHE_BASEDIR="$src" cmake -S "$src" -B "$cache/$sha/build" -G Ninja >/dev/null
    CCACHE_BASEDIR="$src" ninja -C "$cache/$sha/build" specserve >&2
  fi
  [ -x "$cache/$sha/build/bin/specserve" ] || { echo "bench/run_rev_ab.sh: no binary was built for $1" >&2; exit 1; }
  echo "$cache/$sha/build/bin/specserve"
}
va="$(label_of "$1")"; vb="$(label_of "$2")"
[ "$va" != "$vb" ] || { echo "bench/run_rev_ab.sh: A and B are both '$va': nothing to compare" >&2; exit 2; }
bin_a="$(binary_of "$1")"; bin_b="$(binary_of "$2")"
model="$("$here/scripts/fetch-model.sh" | tail -n 1)"
py="$("$here/scripts/venv.sh" --with-plot)"
day="$(date +%Y-%m-%d)"
kernel="$(echo "${SPECSERVE_CPU_MATMUL:-}" | tr -d ' \t' | tr '[:upper:]' '[:lower:]')"
[ -z "$kernel" ] || day="$day-$kernel"
out="$here/bench/results/rev_${va}_vs_${vb}_$day"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
source "$here/bench/ab_specs.sh"  # specs=(...)
# (A revision's binary looks for Spec-Bench beside its own exported source: name this checkout's.)
questions="$here/../shared/data/spec_bench/question.jsonl"
[ -r "$questions" ] || { echo "bench/run_rev_ab.sh: cannot read Spec-Bench's questions at $questions" >&2; exit 2; }
for round in $(seq 1 "$rounds"); do
  for v in "$va" "$vb"; do
    bin="$bin_a"; [ "$v" = "$va" ] || bin="$bin_b"
    echo "[rev-ab] bench-model, $v, round $round of $rounds" >&2
    "$bin" bench-model --model "$model" --threads "$threads" --decode-batches 1 3 5 9 16 --prompt-lengths 128 \
      --decode-tokens 32 --decode-context "$context" --repeats "$repeats" --output "$tmp/model_${v}_$round.json" >/dev/null
    echo "[rev-ab] bench-spec (Spec-Bench, batch 1), $v, round $round of $rounds" >&2
    "$bin" bench-spec --model "$model" --questions "$questions" --threads "$threads" --per-task "$per_task" --max-tokens 64 \
      --batch-sizes 1 "${specs[@]}" --output "$tmp/spec_${v}_$round.json" > "$tmp/spec_${v}_$round.md"
  done
done
env_note=""
[ -z "$kernel" ] || env_note="SPECSERVE_CPU_MATMUL=$kernel "
"$py" "$here/bench/ab_report.py" "$tmp" "$out" "A/B of two builds: $va against $vb" \
  "${env_note}bench/run_rev_ab.sh $1 $2 $threads $repeats $per_task $rounds $context" "$va" "$vb" "$threads" "$repeats" \
  "$per_task" "$rounds" "$context"
