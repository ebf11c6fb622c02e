#!/usr/bin/env bash
# specserve's OpenAI-compatible server beside llama.cpp's (llama-cpp-python's `llama_cpp.server`),
# measured by the same client (`specserve bench`) with the same prompts, settings and threads:
#   llama.cpp        python -m llama_cpp.server --n_threads T (one request at a time: its server
#                    serialises them; --interrupt_requests False so a new request does not cut the
#                    streaming one short, which is that server's default)
#   specserve        specserve serve --threads T (no speculation)
#   specserve-ngram  the same with $SPEC_CONFIG (default n-gram, k = 4, lookup 1..5)
# One server runs at a time (2 cores here); each is stopped before the next starts, and the order
# alternates between rounds (A B C, C B A, ...) so that drift in the machine's load hits all alike.
# Greedy, chat endpoint, Spec-Bench questions no longer than $MAX_PROMPT_CHARS bytes (a long
# prefill on 2 cores would dominate every figure), --duration caps each level.
# Writes bench/results/http_<date>.{json,md,png}.
# Usage: bench/run_http_bench.sh [THREADS]    (default: all cores)
# Environment (defaults): NUM_PROMPTS (32) MAX_TOKENS (64) CONCURRENCY (1,4,8) ROUNDS (1)
#   MAX_PROMPT_CHARS (1000) LEVEL_DURATION (90 s) SPEC_CONFIG (n-gram JSON; empty: no
#   specserve-ngram) SYSTEMS (llama.cpp,specserve,specserve-ngram) PORT (8310) QUIET_CORES (0.5)
#   QUIET_WAIT (120 s: before each server starts, wait this long at most for a quiet machine)
#   SPECSERVE_BUILD_DIR (build) SPECSERVE_NO_BUILD (0) OUT (bench/results/http_<date>)
#   SOURCE_COMMIT (git describe of this checkout: the source the binary was built from, recorded)
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
threads="${1:-$(nproc)}"
build="${SPECSERVE_BUILD_DIR:-$here/build}"
num_prompts="${NUM_PROMPTS:-32}"
max_tokens="${MAX_TOKENS:-64}"
concurrency="${CONCURRENCY:-1,4,8}"
rounds="${ROUNDS:-1}"
max_prompt_chars="${MAX_PROMPT_CHARS:-1000}"
level_duration="${LEVEL_DURATION:-90}"
default_spec='{"method":"ngram","num_speculative_tokens":4,"prompt_lookup_min":1,"prompt_lookup_max":5}'
spec_config="${SPEC_CONFIG-$default_spec}"
systems="${SYSTEMS:-llama.cpp,specserve,specserve-ngram}"
[ -n "$spec_config" ] || systems="$(echo "$systems" | tr ',' '\n' | grep -vx specserve-ngram | paste -sd, -)"
port="${PORT:-8310}"
quiet_cores="${QUIET_CORES:-0.5}"
quiet_wait="${QUIET_WAIT:-120}"

model="$("$here/scripts/fetch-model.sh" | tail -n 1)"
[ "${SPECSERVE_NO_BUILD:-0}" = 1 ] || SPECSERVE_BUILD_DIR="$build" "$here/scripts/build.sh"
bin="$build/bin/specserve"
"$bin" serve --help | grep -q -- '--port' || { echo "[http-bench] $bin serve has no --port (no HTTP front end)" >&2; exit 1; }
py="$("$here/scripts/venv.sh" --with-llama-server --with-plot)"
if curl -s -o /dev/null "http://127.0.0.1:$port/"; then
  echo "[http-bench] port $port is in use: set PORT" >&2; exit 1
fi

day="$(date +%Y-%m-%d)"
commit="${SOURCE_COMMIT:-$(git -C "$here" describe --always --dirty 2>/dev/null || echo unknown)}"
out="${OUT:-$here/bench/results/http_$day}"
work="$(mktemp -d)"
server_pid=""
stop_server() {
  if [ -n "$server_pid" ] && kill -0 "$server_pid" 2>/dev/null; then
    kill -TERM "$server_pid" 2>/dev/null || true
    for _ in $(seq 1 100); do kill -0 "$server_pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$server_pid" 2>/dev/null || true
    wait "$server_pid" 2>/dev/null || true
  fi
  server_pid=""
}
trap 'stop_server; rm -rf "$work"' EXIT

# Starts system $1 on $port in the background; echoes the URL that says it is ready.
start_server() {
  local log="$work/$1.log"
  case "$1" in
    llama.cpp)
      "$py" -m llama_cpp.server --model "$model" --model_alias "$(basename "$model" .gguf)" --n_threads "$threads" \
        --n_threads_batch "$threads" --n_ctx 8192 --host 127.0.0.1 --port "$port" --interrupt_requests False \
        > "$log" 2>&1 &
      server_pid=$!
      ready_path=/v1/models ;;  # llama-cpp-python 0.3.36 has no /health
    specserve|specserve-ngram)
      local spec=()
      [ "$1" = specserve-ngram ] && spec=(--speculative-config "$spec_config")
      "$bin" serve --model "$model" --threads "$threads" --host 127.0.0.1 --port "$port" --actor-port 0 \
        --token-file "$work/token" "${spec[@]}" > "$log" 2>&1 &
      server_pid=$!
      ready_path=/health ;;
    *) echo "[http-bench] unknown system $1 (SYSTEMS)" >&2; exit 2 ;;
  esac
  for _ in $(seq 1 360); do
    if ! kill -0 "$server_pid" 2>/dev/null; then
      echo "[http-bench] $1 exited before it was ready; its log:" >&2; tail -n 30 "$log" >&2; exit 1
    fi
    [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port$ready_path")" = 200 ] && return 0
    sleep 0.5
  done
  echo "[http-bench] $1 not ready after 180 s; its log:" >&2; tail -n 30 "$log" >&2; exit 1
}

# CPU accounting (jiffies): the machine's busy time from /proc/stat, a process tree's from /proc/PID/stat.
hz="$(getconf CLK_TCK)"
busy_jiffies() { awk '/^cpu /{print $2+$3+$4+$7+$8+$9}' /proc/stat; }
tree_jiffies() {  # utime+stime (all threads) of process $1 and its running descendants
  local total c
  total=$(awk '{print $14+$15}' "/proc/$1/stat" 2>/dev/null || echo 0)
  for c in $(pgrep -P "$1" 2>/dev/null); do total=$((total + $(tree_jiffies "$c"))); done
  echo "$total"
}
# Waits (up to $quiet_wait s) until the machine is quiet: at most $quiet_cores busy over 5 s.
# NOTE: on a shared 2-core machine a neighbour's build is the largest error term; what other
# processes used during each run is recorded beside its figures either way.
wait_quiet() {
  local waited=0 b0 b1 cores
  while :; do
    b0=$(busy_jiffies); sleep 5; b1=$(busy_jiffies)
    cores=$(awk "BEGIN { printf \"%.2f\", ($b1 - $b0) / $hz / 5 }")
    if awk "BEGIN { exit !($cores <= $quiet_cores) }"; then return 0; fi
    waited=$((waited + 5))
    if [ "$waited" -ge "$quiet_wait" ]; then
      echo "[http-bench] machine still busy ($cores cores) after ${quiet_wait} s; measuring anyway (recorded)" >&2; return 0
    fi
    echo "[http-bench] other processes use $cores cores > $quiet_cores: waiting ($waited/${quiet_wait} s)" >&2
  done
}
before="$(uptime)"
t_start=$(date +%s)
bench_args=(--endpoint /v1/chat/completions --num-prompts "$num_prompts" --max-prompt-chars "$max_prompt_chars"
            --max-tokens "$max_tokens" --temperature 0 --seed 0 --max-concurrency "$concurrency"
            --duration "$level_duration" --tokenizer "$model")
IFS=',' read -r -a order <<< "$systems"
results=()
for round in $(seq 1 "$rounds"); do
  seq_systems=("${order[@]}")
  if [ $((round % 2)) = 0 ]; then  # reversed every other round
    seq_systems=(); for ((k = ${#order[@]} - 1; k >= 0; k--)); do seq_systems+=("${order[k]}"); done
  fi
  for sys in "${seq_systems[@]}"; do
    echo "[http-bench] round $round/$rounds: $sys" >&2
    wait_quiet
    start_server "$sys"
    res="$work/${sys}_r$round.json"
    b0=$(busy_jiffies); s0=$(tree_jiffies "$server_pid"); w0=$(date +%s.%N)
    if ! "$bin" bench --base-url "http://127.0.0.1:$port" --label "$sys" "${bench_args[@]}" --output-json "$res" \
        > "$work/${sys}_r$round.txt"; then
      cat "$work/${sys}_r$round.txt" >&2
      echo "[http-bench] specserve bench against $sys failed; server log:" >&2; tail -n 30 "$work/$sys.log" >&2
      exit 1
    fi
    b1=$(busy_jiffies); s1=$(tree_jiffies "$server_pid"); w1=$(date +%s.%N)
    echo "$w0 $w1 $b0 $b1 $s0 $s1 $hz" > "${res%.json}.cpu"  # wall clock, machine and server jiffies, USER_HZ
    stop_server
    tail -n 6 "$work/${sys}_r$round.txt" >&2
    results+=("$res")
  done
done
after="$(uptime)"
elapsed=$(( $(date +%s) - t_start ))

llama_cmd="python -m llama_cpp.server --model MODEL --model_alias NAME --n_threads $threads --n_threads_batch $threads --n_ctx 8192 --port P --interrupt_requests False"
ss_cmd="specserve serve --model MODEL --threads $threads --port P --actor-port 0"
"$py" - "$out" "$threads" "$day" "$before" "$after" "$elapsed" "$llama_cmd" "$ss_cmd" "$spec_config" \
  "specserve bench --base-url http://127.0.0.1:P --label SYSTEM ${bench_args[*]}" "$*" "$commit" "${results[@]}" <<'PY'
import json, platform, statistics, subprocess, sys
from collections import defaultdict
(out, threads, day, before, after, elapsed, llama_cmd, ss_cmd, spec_config, bench_cmd, script_args, commit), paths = sys.argv[1:13], sys.argv[13:]
results = [json.load(open(p)) for p in paths]
for r, p in zip(results, paths):
    # CPU during the run: the whole machine, the server's process tree, and the rest (the client
    # included: it uses a few hundredths of a core).
    w0, w1, b0, b1, s0, s1, hz = map(float, open(p[:-len(".json")] + ".cpu").read().split())
    wall = w1 - w0
    busy, server = (b1 - b0) / hz / wall, (s1 - s0) / hz / wall
    r["cpu"] = {"wall_s": round(wall, 1), "busy_cores": round(busy, 2), "server_cores": round(server, 2),
                "other_cores": round(max(0.0, busy - server), 2)}
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
doc = {"date": day, "commit": commit, "host": platform.node(), "cpu": cpu, "threads": int(threads), "load_before": before,
       "load_after": after, "elapsed_s": int(elapsed), "servers": {"llama.cpp": llama_cmd, "specserve": ss_cmd,
       "specserve-ngram": ss_cmd + f" --speculative-config '{spec_config}'"}, "bench_command": bench_cmd,
       "results": results}
for r in results:  # every gap of every request: their statistics are in each run; kept out of the record
    for run in r["runs"]:
        for q in run["requests"]:
            q.pop("itl_ms", None)
json.dump(doc, open(out + ".json", "w"), indent=1)

labels = list(dict.fromkeys(r["label"] for r in results))
by = defaultdict(lambda: defaultdict(list))  # label -> concurrency -> [run]
for r in results:
    for run in r["runs"]:
        by[r["label"]][run["max_concurrency"]].append(run)
med = lambda runs, k: statistics.median(x[k] for x in runs)
L = []
L.append(f"# OpenAI-compatible HTTP serving: specserve vs llama.cpp's server — {doc['host']}, {threads} threads, {day}\n")
L.append(f"Command: `bench/run_http_bench.sh{(' ' + script_args) if script_args else ''}` (model: SmolLM2-135M-Instruct Q4_1; "
         f"machine: {subprocess.check_output(['nproc']).decode().strip()} cores, {cpu}); specserve built from {commit}; "
         f"{len(paths)} bench runs in {elapsed} s.\n")
L.append("Servers, one at a time, same GGUF and threads (the order reversed every other round):\n")
for k, v in doc["servers"].items():
    if k in labels:
        L.append(f"- {k}: `{v}`")
L.append(f"\nClient, the same for each: `{bench_cmd}`\n")
L.append(f"Before: `{before}`; after: `{after}`.\n")
L.append("Median over rounds (each round: one run per concurrency level, at most --duration s of issuing); "
         "TTFT/TPOT/ITL/E2E are each run's medians.\n")
L.append("| system | concurrency | rounds | ok / failed | req/s | output tok/s | total tok/s | TTFT p50 (ms) | TTFT p99 (ms) | TPOT p50 (ms) | ITL p50 (ms) | E2E p50 (s) |")
L.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
for lab in labels:
    for c in sorted(by[lab]):
        runs = by[lab][c]
        ok = sum(x["completed"] for x in runs); bad = sum(x["failed"] for x in runs)
        L.append(f"| {lab} | {c} | {len(runs)} | {ok} / {bad} | {med(runs,'request_throughput'):.2f} | "
                 f"{med(runs,'output_throughput'):.1f} | {med(runs,'total_token_throughput'):.1f} | "
                 f"{med(runs,'median_ttft_ms'):.0f} | {med(runs,'p99_ttft_ms'):.0f} | {med(runs,'median_tpot_ms'):.1f} | "
                 f"{med(runs,'median_itl_ms'):.1f} | {med(runs,'median_e2el_ms')/1e3:.2f} |")
L.append("\nPer run (round, system, concurrency): output tok/s, completed, mean output tokens per request:\n")
for r, p in zip(results, paths):
    rnd = p.rsplit("_r", 1)[1].split(".")[0]
    cells = ", ".join(f"c={x['max_concurrency']}: {x['output_throughput']:.1f} tok/s, {x['completed']} ok"
                      f"{', ' + str(x['failed']) + ' failed' if x['failed'] else ''}, "
                      f"{x['total_output_tokens'] / max(1, x['completed']):.1f} tokens" for x in r["runs"])
    cpu = r["cpu"]
    L.append(f"- round {rnd}, {r['label']}: {cells}; CPU during the run: server {cpu['server_cores']:.2f} cores, "
             f"other processes (client included) {cpu['other_cores']:.2f} cores, {cpu['wall_s']:.0f} s")
# Greedy text agreement: the same prompt (same index, same seed) at concurrency 1 of each system's first run.
first = {}
for r in results:
    first.setdefault(r["label"], r)
if "llama.cpp" in first:
    L.append("\nGreedy outputs against llama.cpp's (concurrency 1, first round, same prompts):\n")
    ref = first["llama.cpp"]["runs"][0]["requests"]
    for lab in labels:
        if lab == "llama.cpp":
            continue
        other = first[lab]["runs"][0]["requests"]
        n = min(len(ref), len(other))
        pairs = [(a, b) for a, b in zip(ref[:n], other[:n]) if a["success"] and b["success"]]
        same = sum(a["generated_text"] == b["generated_text"] for a, b in pairs)
        def prefix(a, b):
            k = 0
            while k < min(len(a), len(b)) and a[k] == b[k]:
                k += 1
            return k
        common = statistics.median(prefix(a["generated_text"], b["generated_text"]) for a, b in pairs) if pairs else 0
        L.append(f"- {lab}: {same} of {len(pairs)} identical; median common prefix {common:.0f} characters")
    # specserve with and without speculation must agree exactly (greedy): check it here too.
    if "specserve" in first and "specserve-ngram" in first:
        a_, b_ = first["specserve"]["runs"][0]["requests"], first["specserve-ngram"]["runs"][0]["requests"]
        pairs = [(a, b) for a, b in zip(a_, b_) if a["success"] and b["success"]]
        same = sum(a["generated_text"] == b["generated_text"] for a, b in pairs)
        L.append(f"- specserve-ngram vs specserve: {same} of {len(pairs)} identical (must be all: greedy speculation is lossless)")
open(out + ".md", "w").write("\n".join(L) + "\n")
PY
"$py" "$here/bench/plot_http_bench.py" -o "$out.png" "$out.json" > /dev/null
cat "$out.md"
echo "[http-bench] wrote $out.{json,md,png}" >&2
