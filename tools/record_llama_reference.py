#!/usr/bin/env python3
"""Records llama.cpp's greedy decoding of the default model as reference data for specserve.

Command that produced tests/data/llama_ref/smollm2_greedy.json (from the repository root):

    $(scripts/venv.sh --with-llama) tools/record_llama_reference.py \
        --model models/SmolLM2-135M-Instruct.Q4_1.gguf \
        --out tests/data/llama_ref/smollm2_greedy.json

Command that produced tests/data/llama_ref/smollm2_greedy_f32.json (from the repository root):

    $(scripts/venv.sh --with-llama) tools/record_llama_reference.py --f32 \
        --model models/SmolLM2-135M-Instruct.Q4_1.gguf \
        --out tests/data/llama_ref/smollm2_greedy_f32.json

--f32 first converts --model to an all-F32 GGUF in a temporary directory with llama.cpp's own
quantize API (llama_model_quantize, ftype LLAMA_FTYPE_ALL_F32, allow_requantize), so every
weight is the exact dequantisation of the Q4_1 blocks, then runs llama.cpp on that file with an
F32 K/V cache (type_k = type_v = GGML_TYPE_F32) and flash attention disabled. This removes
llama.cpp's two approximations on the Q4_1 path (Q8_1-quantised activations in the Q4_1 dot
products, F16 K/V), so the result is a tight fp32 reference for an fp32 implementation. The
prompt ids are those of the default file (the converted GGUF keeps the vocabulary; the script
checks that they equal the ids in tests/data/llama_ref/smollm2_greedy.json when it exists).
model/model_sha256 are the source GGUF's; the top-level "reference" field records the weight
and K/V types and the converted file's sha256. Logits are rounded to 6 decimals (not 4).

For each prompt (chat prompts rendered with the GGUF's own chat template through
llama-cpp-python's Jinja2ChatFormatter; plain prompts as given) the file holds:
  - text:        the exact prompt text tokenised
  - prompt_ids:  llm.tokenize(text.encode(), add_bos=True, special=True); llama.cpp adds BOS
                 only when the vocabulary asks for it (tokenizer.ggml.add_bos_token), so this is
                 "as the model says"; the top-level add_bos field records what happened
  - greedy_ids:  exactly --steps tokens by argmax of the logits (ties -> lowest id, numpy's
                 argmax), with a manual llm.eval() loop, so decoding continues past EOS
  - top5:        per step, the 5 highest (token id, logit) pairs, highest first
  - gap:         per step, logit(top1) - logit(top2): a near-tie (small gap) is where a
                 correct implementation may legitimately pick the other token
  - completion:  the decoded greedy text (for people; not compared)
Settings: n_threads=2, n_ctx=2048, n_batch=512, CPU only, flash attention off. Logits are
rounded to 4 decimals (6 with --f32).
"""

import argparse
import hashlib
import json
import os
import platform
import sys
import tempfile

import numpy as np

import llama_cpp
from llama_cpp import Llama
from llama_cpp.llama_chat_format import Jinja2ChatFormatter

LIGHTHOUSE = """The history of the lighthouse is, in many ways, the history of maritime trade itself. Long before the invention of the electric lamp, coastal communities lit fires on hilltops and cliffs to warn sailors of dangerous rocks and to guide them safely into harbour. The most famous of these early structures was the Pharos of Alexandria, built in the third century BC on a small island at the mouth of the city's harbour. Ancient writers claimed that its light could be seen from more than thirty miles away, although modern historians treat such figures with caution. The tower survived for well over a thousand years before a series of earthquakes finally brought it down in the fourteenth century.

During the Middle Ages, lighthouses were few and far between. Many were maintained by monasteries or by local lords who charged a fee to ships entering their waters. The fuel was usually wood or coal, burned in an open brazier at the top of a stone tower, and the light it produced was weak, smoky and unreliable. Keepers had to climb the stairs many times each night to feed the fire, and in bad weather the flames were often extinguished altogether.

The eighteenth and nineteenth centuries brought a series of improvements that transformed the lighthouse into a precise scientific instrument. Oil lamps with hollow wicks, introduced by the Swiss inventor Aimé Argand, burned far more brightly and cleanly than open fires. Parabolic reflectors concentrated the light into a beam, and in 1822 the French physicist Augustin Fresnel designed a lens made of concentric rings of glass prisms. A Fresnel lens could capture almost all of the light from a lamp and project it towards the horizon, and lighthouses fitted with the new lenses could be seen at distances that had previously been impossible.

Lighthouse keeping remained a demanding and often lonely profession. Keepers and their families lived at remote stations for months at a time, recording the weather, cleaning the lenses, trimming the wicks and winding the clockwork mechanisms that rotated the lights. Some of the most isolated stations were built on bare rocks far out at sea, where supplies could only be landed in calm weather. Stories of keepers who kept their lights burning through storms, illness and shipwreck became part of the folklore of many coastal nations.

In the twentieth century, electricity, automatic timers and radio navigation gradually made the resident keeper unnecessary. Most lighthouses are now automated and monitored from distant control centres, and satellite navigation has reduced their importance even further. Yet many towers are still maintained as aids to navigation, and hundreds more have been preserved as museums, reminders of a time when a single light on a dark coast could mean the difference between a safe arrival and disaster."""

SOURDOUGH = """Sourdough bread is one of the oldest forms of leavened bread, and for most of human history it was simply how bread was made. Instead of using commercial yeast, a sourdough baker relies on a starter: a mixture of flour and water that has been colonised by wild yeasts and lactic acid bacteria. These microorganisms are present on the grain itself, in the air and on the baker's hands, and when flour and water are left together in a warm place they begin to multiply. After several days of regular feeding, the starter becomes lively and predictable, rising and falling on a daily rhythm.

The yeasts in a starter produce carbon dioxide, which becomes trapped in the gluten network of the dough and makes it rise. The bacteria, meanwhile, produce lactic and acetic acids. These acids give sourdough its characteristic tangy flavour, but they also have practical benefits. They slow the growth of mould, so sourdough bread tends to stay fresh for longer than bread made with commercial yeast, and they begin to break down some of the compounds in flour that can make bread harder to digest.

Making a loaf of sourdough is a slow process. A typical recipe begins the evening before baking, when a portion of the starter is mixed with fresh flour and water to make a levain. The next morning, the levain is combined with the rest of the flour, water and salt, and the dough is left to ferment for several hours. During this time the baker gently stretches and folds the dough every half hour or so, which strengthens the gluten without the vigorous kneading used for other breads. The dough is then shaped, placed in a floured basket and left to rise again, often overnight in a refrigerator, where the cold temperature slows the yeast while allowing the flavour to develop.

Baking is the final and most dramatic stage. Many home bakers use a heavy cast iron pot with a lid, preheated in a very hot oven. The lid traps steam released by the dough, which keeps the surface soft during the first part of baking and allows the loaf to expand fully. When the lid is removed, the crust darkens and hardens, developing the deep colour and crackling texture that sourdough lovers prize. A well-made loaf should sound hollow when tapped on the bottom, and it should be left to cool completely before it is sliced, because the crumb continues to set as the steam escapes."""

# (name, kind, payload): kind "plain" -> payload is the text; "chat" -> a messages list.
CASES = [
    ("plain_capital", "plain", "The capital of France is"),
    ("plain_story", "plain", "Once upon a time, in a small village by the sea,"),
    ("plain_code", "plain", "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"),
    ("plain_unicode", "plain",
     "Café, naïve, jalapeño — “quotes” and emoji 🙂. 日本語のテキスト. Numbers: 3.14159, 2024-06-01, 1,000,000.\nSummary:"),
    ("chat_capital", "chat", [{"role": "user", "content": "What is the capital of France?"}]),
    ("chat_system_haiku", "chat", [
        {"role": "system", "content": "You are a concise assistant who answers in verse."},
        {"role": "user", "content": "Write a haiku about autumn leaves."},
    ]),
    ("chat_multiturn", "chat", [
        {"role": "user", "content": "I have 3 apples and buy 5 more. How many do I have?"},
        {"role": "assistant", "content": "You have 8 apples."},
        {"role": "user", "content": "Now I eat two of them. How many are left? Explain step by step."},
    ]),
    ("plain_long_lighthouse", "plain",
     LIGHTHOUSE + "\n\nQuestion: According to the passage, which invention allowed lighthouses to be "
     "seen at much greater distances, and who designed it?\nAnswer:"),
    ("chat_long_sourdough", "chat", [
        {"role": "user", "content": SOURDOUGH + "\n\nBased on the text above, explain in two sentences "
         "why sourdough bread stays fresh longer than bread made with commercial yeast."},
    ]),
    ("chat_long_lighthouse_summary", "chat", [
        {"role": "system", "content": "You are a helpful assistant that writes short summaries."},
        {"role": "user", "content": "Summarise the following text in three bullet points.\n\n" + LIGHTHOUSE},
    ]),
]


def sha256_of(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def token_text(llm, tid):
    return llm.detokenize([tid]).decode("utf-8", errors="replace")


def last_logits(llm):
    """A copy of the logits of the last token of the last eval() (llama_get_logits_ith(-1)).
    NOTE: llama-cpp-python 0.3.x no longer fills llm.scores unless logits_all=True, which would
    also compute the output layer for every prompt row; reading the context avoids both."""
    ptr = llama_cpp.llama_get_logits_ith(llm._ctx.ctx, -1)
    return np.ctypeslib.as_array(ptr, shape=(llm.n_vocab(),)).astype(np.float32, copy=True)


def greedy(llm, prompt_ids, steps, decimals=4):
    """Exactly `steps` argmax tokens after prompt_ids, with top-5 (id, logit) and the top-2 gap
    at every step. Uses eval() directly so EOS does not stop the loop."""
    llm.reset()
    llm.eval(prompt_ids)
    out, top5, gap = [], [], []
    for _ in range(steps):
        logits = last_logits(llm)
        order = np.argsort(-logits, kind="stable")[:5]  # stable: ties -> lower id first
        tok = int(np.argmax(logits))
        assert tok == int(order[0])
        top5.append([[int(i), round(float(logits[i]), decimals)] for i in order])
        gap.append(round(float(logits[order[0]] - logits[order[1]]), decimals))
        out.append(tok)
        llm.eval([tok])
    return out, top5, gap


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="models/SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--out", default="tests/data/llama_ref/smollm2_greedy.json")
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--f32", action="store_true",
                    help="run llama.cpp on --model converted to all-F32 weights, with an F32 K/V cache")
    ap.add_argument("--check-prompts", default="tests/data/llama_ref/smollm2_greedy.json",
                    help="with --f32: a reference file whose prompt_ids must equal ours (skipped if absent)")
    args = ap.parse_args()

    decimals = 6 if args.f32 else 4
    run_model = args.model
    tmp = None
    reference = {"weights": "as stored in the GGUF", "type_k": "f16", "type_v": "f16", "flash_attn": False}
    kv_args = {}
    if args.f32:
        tmp = tempfile.TemporaryDirectory(prefix="specserve_f32_")
        run_model = os.path.join(tmp.name, "model_f32.gguf")
        qp = llama_cpp.llama_model_quantize_default_params()
        qp.ftype = llama_cpp.LLAMA_FTYPE_ALL_F32
        qp.allow_requantize = True
        qp.nthread = args.threads
        rc = llama_cpp.llama_model_quantize(args.model.encode(), run_model.encode(), qp)
        if rc != 0:
            sys.exit(f"llama_model_quantize(ALL_F32) failed: {rc}")
        kv_args = {"type_k": llama_cpp.GGML_TYPE_F32, "type_v": llama_cpp.GGML_TYPE_F32}
        reference = {
            "weights": "f32: the source GGUF converted by llama_model_quantize(ftype=LLAMA_FTYPE_ALL_F32, "
                       "allow_requantize=true)",
            "converted_model_sha256": sha256_of(run_model),
            "type_k": "f32", "type_v": "f32", "flash_attn": False,
        }
        print(f"converted {args.model} to {run_model} ({os.path.getsize(run_model)} bytes)", file=sys.stderr)

    llm = Llama(model_path=run_model, n_ctx=2048, n_batch=512, n_threads=args.threads,
                n_threads_batch=args.threads, n_gpu_layers=0, seed=0, flash_attn=False,
                verbose=False, **kv_args)
    expected_ids = {}
    if args.f32 and args.check_prompts and os.path.exists(args.check_prompts):
        with open(args.check_prompts, encoding="utf-8") as f:
            expected_ids = {c["name"]: c["prompt_ids"] for c in json.load(f)["cases"]}
    meta = llm.metadata
    bos, eos = llm.token_bos(), llm.token_eos()
    template = meta.get("tokenizer.chat_template")
    if template is None:
        sys.exit("the model has no tokenizer.chat_template")
    formatter = Jinja2ChatFormatter(template=template, eos_token=token_text(llm, eos),
                                    bos_token=token_text(llm, bos), add_generation_prompt=True)

    cases = []
    for name, kind, payload in CASES:
        if kind == "chat":
            text = formatter(messages=payload).prompt
        else:
            text = payload
        ids = llm.tokenize(text.encode("utf-8"), add_bos=True, special=True)
        if name in expected_ids and expected_ids[name] != ids:
            sys.exit(f"{name}: prompt ids differ from {args.check_prompts}")
        if len(ids) + args.steps > 2048:
            sys.exit(f"{name}: prompt of {len(ids)} tokens does not fit n_ctx")
        gen, top5, gap = greedy(llm, ids, args.steps, decimals)
        case = {"name": name, "kind": kind}
        if kind == "chat":
            case["messages"] = payload
        case.update({
            "text": text,
            "num_prompt_tokens": len(ids),
            "prompt_ids": ids,
            "greedy_ids": gen,
            "completion": llm.detokenize(gen).decode("utf-8", errors="replace"),
            "top5": top5,
            "gap": gap,
        })
        cases.append(case)
        near = sum(1 for g in gap if g < 0.1)
        print(f"{name:30s} prompt {len(ids):4d} tokens, min gap {min(gap):.4f}, "
              f"{near} steps with gap < 0.1, eos in output: {eos in gen}", file=sys.stderr)

    doc = {
        "generator": "tools/record_llama_reference.py",
        "command": "$(scripts/venv.sh --with-llama) tools/record_llama_reference.py "
                   + ("--f32 " if args.f32 else "") + "--model "
                   f"{args.model} --out {args.out}" + (f" --steps {args.steps}" if args.steps != 64 else "")
                   + (f" --threads {args.threads}" if args.threads != 2 else ""),
        "llama_cpp_python_version": llama_cpp.__version__,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "model": os.path.basename(args.model),
        "model_sha256": sha256_of(args.model),
        "reference": reference,
        "settings": {"n_ctx": 2048, "n_batch": 512, "n_threads": args.threads, "steps": args.steps,
                     "decoding": "greedy argmax, ties -> lowest id, no EOS stop",
                     "flash_attn": False, "logit_decimals": decimals},
        "n_vocab": llm.n_vocab(),
        "bos_token_id": bos,
        "eos_token_id": eos,
        "add_bos_token_metadata": meta.get("tokenizer.ggml.add_bos_token"),  # string or None
        "add_bos": bool(llm._model.add_bos_token()),
        "chat_template": template,
        "cases": cases,
    }
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=False, separators=(",", ":"))
        f.write("\n")
    if tmp is not None:
        tmp.cleanup()
    print(f"wrote {args.out}: {len(cases)} cases, {os.path.getsize(args.out)} bytes", file=sys.stderr)


if __name__ == "__main__":
    main()
