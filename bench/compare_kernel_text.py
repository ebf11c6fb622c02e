#!/usr/bin/env python3
"""Greedy text of two CPU matmul kernels (SPECSERVE_CPU_MATMUL, cpu/matmul.h) side by side.

Runs `specserve generate --chat QUESTION --temperature 0 --ignore-eos` once per kernel on the first
N Spec-Bench questions of each category (first turn) and prints, per question, whether the two
texts are identical and how many leading characters they share, as a markdown table. Used to say
how far bf16 (amx) moves greedy output from fp32 (avx512); not a timing.
"""
import argparse
import json
import os
import subprocess
import sys

here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("--questions", default=os.path.join(here, "..", "shared", "data", "spec_bench", "question.jsonl"),
                help="Spec-Bench question.jsonl (default: ../shared/data/spec_bench/ beside the checkout)")
ap.add_argument("--per-category", type=int, default=2, help="questions per category (default 2)")
ap.add_argument("--max-tokens", type=int, default=64, help="tokens per answer (default 64)")
ap.add_argument("--kernels", nargs=2, default=["avx512", "amx"], metavar=("A", "B"), help="the two SPECSERVE_CPU_MATMUL values")
ap.add_argument("--binary", default=os.path.join(here, "build", "bin", "specserve"), help="specserve binary")
ap.add_argument("--threads", default="2", help="OMP_NUM_THREADS for each run (default 2)")
args = ap.parse_args()
if args.per_category < 1 or args.max_tokens < 1:
    sys.exit("compare_kernel_text.py: --per-category and --max-tokens must be at least 1")
try:
    questions = [json.loads(line) for line in open(args.questions) if line.strip()]
except (OSError, json.JSONDecodeError) as e:
    sys.exit(f"compare_kernel_text.py: --questions {args.questions}: {e}")
seen, picked = {}, []
for q in questions:
    c = q["category"]
    if seen.get(c, 0) < args.per_category:
        seen[c] = seen.get(c, 0) + 1
        picked.append(q)
a_name, b_name = args.kernels
print(f"| category | {a_name} vs {b_name} | leading characters shared |")
print("|---|---|---|")
same = 0
for i, q in enumerate(picked):
    texts = []
    for k in args.kernels:
        env = dict(os.environ, SPECSERVE_CPU_MATMUL=k, OMP_NUM_THREADS=args.threads)
        r = subprocess.run([args.binary, "generate", "--chat", q["turns"][0], "--max-tokens", str(args.max_tokens),
                            "--temperature", "0", "--ignore-eos"], env=env, capture_output=True, text=True)
        if r.returncode != 0:
            sys.exit(f"compare_kernel_text.py: {k}: specserve generate failed ({r.returncode}): {r.stderr[-500:]}")
        texts.append(r.stdout.split("\n--- prompt tokens")[0])
    a, b = texts
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    same += a == b
    print(f"| {q['category']} | {'identical' if a == b else 'differs'} | {n} of {len(a)} |", flush=True)
    print(f"[compare] {i + 1}/{len(picked)} questions", file=sys.stderr, flush=True)
print(f"\nIdentical: {same} of {len(picked)} ({args.max_tokens} tokens, greedy).")
