#!/usr/bin/env bash
# Trains the Medusa and EAGLE heads of the default model (SmolLM2-135M-Instruct Q4_1) on the CPU
# (from random weights, or EAGLE from --eagle-init), and writes them where the runtime and the
# repository expect them; the heads are trained into --work and copied over models/heads/ only
# once both trainers and the reference outputs have succeeded:
#   1. fetch the model (scripts/fetch-model.sh) and build specserve (scripts/build.sh)
#   2. the Python environment (tools/train/venv.sh: torch, numpy, matplotlib, gguf)
#   3. a prompt corpus (tools/train/make_prompts.py: ShareGPT first human turns by default, or
#      templated prompts; never Spec-Bench)
#   4. self-distillation data: `specserve dump-hidden` (greedy continuations, hidden states)
#   5. tools/train/train_medusa.py and train_eagle.py (curves to bench/results/)
#   6. tools/train/make_reference.py (tests/data/heads_reference.json),
#      tools/train/eagle_chain_reference.py (tests/data/eagle_chain_reference.json),
#      tools/train/quantize_head.py (the Q8_0 copies models/heads/*.q8_0.gguf) and
#      models/heads/SHA256SUMS
# Usage: tools/train/train_all.sh [--work DIR] [--prompt-source S] [--num-prompts N]
#          [--extra-templates N] [--max-new-tokens N] [--medusa-epochs N] [--eagle-epochs N]
#          [--eagle-init GGUF] [--eagle-lr LR] [--max-minutes M] [--threads N] [--parallel]
#          [--conversations N] [--seed S] [--eagle-only] [--skip-build] [--skip-dump] [--tag T]
#   --work DIR          scratch space for prompts, the dump (float16 hidden states: ~0.5 GB for
#                       1,800 prompts of 96 new tokens), checkpoints and the new heads
#                       (default ~/.cache/specserve/train)
#   --prompt-source S   sharegpt (default) or templates (make_prompts.py --source)
#   --num-prompts N     prompts in the corpus (default 640)
#   --extra-templates N also append N templated prompts (make_prompts.py --source templates; default 0),
#                       for the task kinds Spec-Bench weighs more than ShareGPT does (translation,
#                       summarisation, math, extraction)
#   --max-new-tokens N  greedy continuation per prompt (default 96)
#   --conversations N   also N whole ShareGPT exchanges (first human turn and its reply,
#                       make_prompts.py --with-reply), run teacher-forced through the target
#                       (dump-hidden --max-new-tokens 1 --max-prompt-tokens 1024) into
#                       WORK/dump-conv: EAGLE's fixed-data recipe (here 297 rows/s against 178
#                       generated tokens/s of greedy generation). EAGLE trains on both dumps; Medusa (which
#                       learns the target's own continuations) on the generated one only. The
#                       --num-prompts generation prompts are then the user turns of further
#                       exchanges of the same sample (one make_prompts.py call of N +
#                       --num-prompts, split in file order), so no prompt is in both dumps.
#                       Default 0 (generation only); needs --prompt-source sharegpt and
#                       --num-prompts >= 1. With --skip-dump both dumps are reused only when
#                       both exist; otherwise the prompts and both dumps are made again.
#   --seed S            make_prompts.py's sampling seed (default 0)
#   --eagle-only        train only the EAGLE head; the committed Medusa head stays (and is what
#                       the references of step 6 are computed for); --parallel and
#                       --medusa-epochs do not apply
#   --medusa-epochs N   (default 10)     --eagle-epochs N (default 8)
#   --eagle-init GGUF   start EAGLE from this exported head (train_eagle.py --init; default: random)
#   --eagle-lr LR       EAGLE learning rate (default 1e-3)
#   --max-minutes M     wall-time cap per trainer (default 40; a safety stop)
#   --threads N         torch / specserve threads (default 2)
#   --parallel          train Medusa and EAGLE at the same time (one thread each)
#   --skip-build        use the existing build/bin/specserve
#   --skip-dump         reuse the dump already in --work
#   --tag T             suffix of bench/results/train_{medusa,eagle}_T.{json,png} (default: today)
set -euo pipefail
here="$(cd "$(dirname "$0")/../.." && pwd)"
work="${SPECSERVE_CACHE:-$HOME/.cache/specserve}/train"
prompt_source=sharegpt num_prompts=640 max_new=96 medusa_epochs=10 eagle_epochs=8 threads=2 parallel=0 skip_build=0 skip_dump=0
extra_templates=0 max_minutes=40 tag="$(date +%F)" eagle_extra=() conversations=0 seed=0 eagle_only=0
cmdline="tools/train/train_all.sh $*"
while [ $# -gt 0 ]; do
  # A flag that takes a value must have one (it failed with "$2: unbound variable"), not the next flag.
  case "$1" in
    --work|--prompt-source|--num-prompts|--extra-templates|--max-new-tokens|--medusa-epochs|--eagle-epochs|--eagle-init|\
    --eagle-lr|--max-minutes|--threads|--conversations|--seed|--tag)
      if [ $# -lt 2 ] || [ "${2#--}" != "$2" ]; then echo "train_all.sh: $1 needs a value (see --help)" >&2; exit 2; fi ;;
  esac
  case "$1" in
    --work) work="$2"; shift 2 ;;
    --prompt-source) prompt_source="$2"; shift 2 ;;
    --num-prompts) num_prompts="$2"; shift 2 ;;
    --extra-templates) extra_templates="$2"; shift 2 ;;
    --max-new-tokens) max_new="$2"; shift 2 ;;
    --medusa-epochs) medusa_epochs="$2"; shift 2 ;;
    --eagle-epochs) eagle_epochs="$2"; shift 2 ;;
    --eagle-init) init="$2"; [ "${init#/}" != "$init" ] || init="$PWD/$init"; eagle_extra+=(--init "$init"); shift 2 ;;  # (from the caller's directory: the script cds to the repository)
    --eagle-lr) eagle_extra+=(--lr "$2"); shift 2 ;;
    --max-minutes) max_minutes="$2"; shift 2 ;;
    --threads) threads="$2"; shift 2 ;;
    --parallel) parallel=1; shift ;;
    --conversations) conversations="$2"; shift 2 ;;
    --seed) seed="$2"; shift 2 ;;
    --eagle-only) eagle_only=1; shift ;;
    --skip-build) skip_build=1; shift ;;
    --skip-dump) skip_dump=1; shift ;;
    --tag) tag="$2"; shift 2 ;;
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    *) echo "train_all.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
case "$conversations" in ''|*[!0-9]*) echo "train_all.sh: --conversations $conversations: must be a whole number >= 0" >&2; exit 2 ;; esac
case "$num_prompts" in ''|*[!0-9]*) echo "train_all.sh: --num-prompts $num_prompts: must be a whole number" >&2; exit 2 ;; esac
for pair in "--extra-templates:$extra_templates" "--medusa-epochs:$medusa_epochs" "--eagle-epochs:$eagle_epochs" \
            "--max-minutes:$max_minutes" "--max-new-tokens:$max_new" "--threads:$threads" "--seed:$seed"; do
  case "${pair#*:}" in ''|*[!0-9]*) echo "train_all.sh: ${pair%%:*} ${pair#*:}: must be a whole number >= 0" >&2; exit 2 ;; esac
done
# A missing --eagle-init file is found now, not after the dump (which can take an hour).
for ((i = 0; i < ${#eagle_extra[@]}; i += 2)); do
  if [ "${eagle_extra[i]}" = --init ] && [ ! -f "${eagle_extra[i + 1]}" ]; then
    echo "train_all.sh: --eagle-init ${eagle_extra[i + 1]}: no such file" >&2; exit 2
  fi
done
if [ "$conversations" -gt 0 ] && [ "$prompt_source" != sharegpt ]; then
  echo "train_all.sh: --conversations needs --prompt-source sharegpt" >&2; exit 2
fi
if [ "$conversations" -gt 0 ] && [ "$num_prompts" -lt 1 ]; then
  echo "train_all.sh: --conversations needs --num-prompts >= 1 (the generations carry the held-out measure)" >&2; exit 2
fi
cd "$here"
mkdir -p "$work" models/heads bench/results
log() { echo "[train-all $(date +%T)] $*" >&2; }

model="$(scripts/fetch-model.sh)"
if [ "$skip_build" = 0 ]; then
  log "building specserve"
  SPECSERVE_BUILD_JOBS="${SPECSERVE_BUILD_JOBS:-2}" scripts/build.sh
fi
bin="${SPECSERVE_BUILD_DIR:-$here/build}/bin/specserve"
py="$(tools/train/venv.sh | tail -1)"

eagle_dumps=("$work/dump")
[ "$conversations" -gt 0 ] && eagle_dumps+=("$work/dump-conv")
if [ "$skip_dump" = 0 ] || [ ! -f "$work/dump/index.json" ] ||
   { [ "$conversations" -gt 0 ] && [ ! -f "$work/dump-conv/index.json" ]; }; then
  if [ "$conversations" -gt 0 ]; then
    log "prompts: $conversations whole ShareGPT exchanges, then $num_prompts user turns of further ones (seed $seed)"
    "$py" tools/train/make_prompts.py --source sharegpt --with-reply --out "$work/exchanges.jsonl" \
      --num "$((conversations + num_prompts))" --seed "$seed"
    head -n "$conversations" "$work/exchanges.jsonl" > "$work/conversations.jsonl"
    tail -n "+$((conversations + 1))" "$work/exchanges.jsonl" |
      "$py" -c 'import json, sys
for line in sys.stdin:
    r = json.loads(line); r["messages"] = r["messages"][:1]; print(json.dumps(r, ensure_ascii=False))' > "$work/prompts.jsonl"
  else
    log "prompts: $num_prompts ($prompt_source)"
    "$py" tools/train/make_prompts.py --source "$prompt_source" --out "$work/prompts.jsonl" --num "$num_prompts" --seed "$seed"
  fi
  if [ "$extra_templates" -gt 0 ]; then
    log "extra templated prompts: $extra_templates"
    "$py" tools/train/make_prompts.py --source templates --out "$work/prompts-templates.jsonl" --num "$extra_templates" --seed 0
    cat "$work/prompts-templates.jsonl" >> "$work/prompts.jsonl"
  fi
  log "dump-hidden (greedy continuations of $max_new tokens, hidden states recorded as they are generated)"
  "$bin" dump-hidden --model "$model" --prompts "$work/prompts.jsonl" --out "$work/dump" \
    --max-new-tokens "$max_new" --max-num-seqs 32 --threads "$threads"
  if [ "$conversations" -gt 0 ]; then
    log "dump-hidden, teacher-forced over $conversations exchanges (prompt rows only)"
    "$bin" dump-hidden --model "$model" --prompts "$work/conversations.jsonl" --out "$work/dump-conv" \
      --max-new-tokens 1 --max-prompt-tokens 1024 --max-num-seqs 8 --threads "$threads"
  fi
fi

mkdir -p "$work/heads"
medusa_out="$work/heads/medusa-smollm2-135m.gguf" eagle_out="$work/heads/eagle-smollm2-135m.gguf"
medusa_cmd=("$py" tools/train/train_medusa.py --dump "$work/dump" --out "$medusa_out"
            --epochs "$medusa_epochs" --max-minutes "$max_minutes" --curves "bench/results/train_medusa_$tag"
            --save-torch "$work/medusa.pt")
eagle_cmd=("$py" tools/train/train_eagle.py --dump "${eagle_dumps[@]}" --out "$eagle_out"
           --epochs "$eagle_epochs" --max-minutes "$max_minutes" --curves "bench/results/train_eagle_$tag"
           --save-torch "$work/eagle.pt" ${eagle_extra[@]+"${eagle_extra[@]}"})
if [ "$eagle_only" = 1 ]; then
  log "training EAGLE only; Medusa stays models/heads/medusa-smollm2-135m.gguf"
  cp models/heads/medusa-smollm2-135m.gguf "$medusa_out"
  "${eagle_cmd[@]}" --threads "$threads"
elif [ "$parallel" = 1 ]; then
  log "training Medusa and EAGLE in parallel (1 thread each); logs in $work/train_{medusa,eagle}.log"
  "${medusa_cmd[@]}" --threads 1 > "$work/train_medusa.log" 2>&1 &
  mpid=$!
  "${eagle_cmd[@]}" --threads 1 > "$work/train_eagle.log" 2>&1 &
  epid=$!
  wait "$mpid" || { cat "$work/train_medusa.log" >&2; exit 1; }
  wait "$epid" || { cat "$work/train_eagle.log" >&2; exit 1; }
  tail -n 3 "$work/train_medusa.log" "$work/train_eagle.log" >&2
else
  log "training Medusa"
  "${medusa_cmd[@]}" --threads "$threads"
  log "training EAGLE"
  "${eagle_cmd[@]}" --threads "$threads"
fi

log "reference outputs and checksums"
"$py" tools/train/make_reference.py --dump "$work/dump" --medusa "$medusa_out" \
  --eagle "$eagle_out" --out "$work/heads/heads_reference.json" --command "$cmdline"
"$py" tools/train/eagle_chain_reference.py --dump "$work/dump" --eagle "$eagle_out" \
  --cases-only --cases 6 --window 6 --depth 4 --cases-out "$work/heads/eagle_chain_reference.json" \
  --command "$cmdline; tools/train/eagle_chain_reference.py --dump DUMP --eagle models/heads/eagle-smollm2-135m.gguf --cases-only --cases 6 --window 6 --depth 4 --cases-out tests/data/eagle_chain_reference.json (DUMP: train_all's generation dump; the first 6 sequences held out by that dump's own split, which under --conversations is not the trainer's, whose chains have no near-tie)"
log "installing the new heads over models/heads/ and their references over tests/data/"
cp "$medusa_out" "$eagle_out" models/heads/
cp "$work/heads/heads_reference.json" "$work/heads/eagle_chain_reference.json" tests/data/
log "Q8_0 copies of both heads (tools/train/quantize_head.py: the files serving uses; models/heads/README.md)"
for h in medusa eagle; do
  "$py" tools/train/quantize_head.py "models/heads/$h-smollm2-135m.gguf" "models/heads/$h-smollm2-135m.q8_0.gguf" > /dev/null
done
(cd models/heads && sha256sum medusa-smollm2-135m.gguf eagle-smollm2-135m.gguf medusa-smollm2-135m.q8_0.gguf \
  eagle-smollm2-135m.q8_0.gguf > SHA256SUMS && cat SHA256SUMS >&2)
curves="train_{medusa,eagle}_$tag"
[ "$eagle_only" = 1 ] && curves="train_eagle_$tag"
log "done: models/heads/, bench/results/$curves.{json,png}, tests/data/{heads,eagle_chain}_reference.json"
