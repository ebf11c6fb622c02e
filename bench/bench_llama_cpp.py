#!/usr/bin/env python3
"""llama.cpp's CPU speed on the default model, the baseline specserve is compared against.

Command (from the repository root):

    $(scripts/venv.sh --with-llama) bench/bench_llama_cpp.py \
        --model models/SmolLM2-135M-Instruct.Q4_1.gguf > bench/results/llama_cpp_<machine>.json

Measures, through llama-cpp-python with n_threads=2, n_ctx=2048, n_batch=512:
  - prefill tokens/s for a 256- and a 512-token prompt (one llm.eval() of the whole prompt,
    from an empty KV cache);
  - decode tokens/s at batch 1: 128 greedy tokens, one llm.eval([token]) each, after a
    32-token prompt (includes llama-cpp-python's small per-call Python overhead).
Each figure is the median of --runs runs (default 3) after one untimed warm-up run.
Prints one JSON object on stdout, with the load average before and after: ggml's OpenMP
threads spin at barriers, so with other work on the cores (load above ~0.5 on a 2-core machine)
2-thread figures drop several-fold and vary run to run; only a quiet machine's numbers count.
"""

import argparse
import json
import os
import platform
import statistics
import time

import numpy as np

import llama_cpp
from llama_cpp import Llama

TEXT = (
    "The history of the lighthouse is, in many ways, the history of maritime trade itself. "
    "Long before the invention of the electric lamp, coastal communities lit fires on hilltops "
    "and cliffs to warn sailors of dangerous rocks and to guide them safely into harbour. "
    "Keepers had to climb the stairs many times each night to feed the fire, and in bad weather "
    "the flames were often extinguished altogether. Oil lamps with hollow wicks burned far more "
    "brightly and cleanly than open fires, and a Fresnel lens could capture almost all of the "
    "light from a lamp and project it towards the horizon. "
)


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def prompt_of(llm, n):
    """Exactly n token ids: BOS (when the model adds one) and repeated English text."""
    ids = llm.tokenize((TEXT * 8).encode(), add_bos=True, special=False)
    while len(ids) < n:
        ids += llm.tokenize(TEXT.encode(), add_bos=False, special=False)
    return ids[:n]


def last_logits(llm):
    """A copy of the logits of the last token of the last eval() (llama_get_logits_ith(-1)).
    NOTE: llama-cpp-python 0.3.x no longer fills llm.scores unless logits_all=True, which would
    also compute the output layer for every prompt row; reading the context avoids both."""
    ptr = llama_cpp.llama_get_logits_ith(llm._ctx.ctx, -1)
    return np.ctypeslib.as_array(ptr, shape=(llm.n_vocab(),)).astype(np.float32, copy=True)


def time_prefill(llm, ids):
    llm.reset()  # eval() drops the KV cache past n_tokens, so this starts from empty
    t0 = time.perf_counter()
    llm.eval(ids)
    return len(ids) / (time.perf_counter() - t0)


def time_decode(llm, prompt, n):
    llm.reset()
    llm.eval(prompt)
    tok = int(np.argmax(last_logits(llm)))
    t0 = time.perf_counter()
    for _ in range(n):
        llm.eval([tok])
        tok = int(np.argmax(last_logits(llm)))
    return n / (time.perf_counter() - t0)


def median_of(runs, fn):
    fn()  # warm-up
    vals = [fn() for _ in range(runs)]
    return {"median": round(statistics.median(vals), 2), "runs": [round(v, 2) for v in vals]}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="models/SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--decode-tokens", type=int, default=128)
    args = ap.parse_args()

    load_before = os.getloadavg()
    llm = Llama(model_path=args.model, n_ctx=2048, n_batch=512, n_threads=args.threads,
                n_threads_batch=args.threads, n_gpu_layers=0, verbose=False)
    result = {
        "bench": "bench/bench_llama_cpp.py",
        "engine": "llama.cpp via llama-cpp-python",
        "llama_cpp_python_version": llama_cpp.__version__,
        "model": os.path.basename(args.model),
        "machine": {"cpu": cpu_name(), "nproc": os.cpu_count(), "platform": platform.platform()},
        "settings": {"n_threads": args.threads, "n_ctx": 2048, "n_batch": 512, "runs": args.runs},
        "prefill_tokens_per_s": {},
    }
    for n in (256, 512):
        ids = prompt_of(llm, n)
        result["prefill_tokens_per_s"][str(n)] = median_of(args.runs, lambda: time_prefill(llm, ids))
    prompt = prompt_of(llm, 32)
    result["decode_tokens_per_s"] = {
        "batch": 1, "prompt_tokens": 32, "tokens": args.decode_tokens,
        **median_of(args.runs, lambda: time_decode(llm, prompt, args.decode_tokens)),
    }
    result["loadavg_1min"] = {"before": round(load_before[0], 2), "after": round(os.getloadavg()[0], 2)}
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
