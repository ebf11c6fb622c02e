#!/usr/bin/env python3
"""tools/train/quantize_head.py against the committed heads: run on models/heads/*-smollm2-135m.gguf
it writes exactly the committed *.q8_0.gguf files (with gguf 0.19.0, which scripts/venv.sh pins) (the command in models/heads/README.md
reproduces them); every matrix is Q8_0 within ggml's rounding bound of the F16 values (half a
step, amax / 254 per 32-value block, plus the fp16 rounding of the scale), every vector and
metadata key is kept with its type; a file that is not a GGUF, a GGUF that is not a head, or the
input named as the output is refused with exit status 1 and a message naming it.

Usage: tests/e2e/run_python_test.sh tests/e2e/quantize_head_test.py [--bin IGNORED]
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np
from gguf import GGUFReader, GGMLQuantizationType as Q
from gguf import quants

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
TOOL = os.path.join(ROOT, "tools", "train", "quantize_head.py")
HEADS = os.path.join(ROOT, "models", "heads")
failures = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        failures.append(what)


def run_tool(src, dst):
    return subprocess.run([sys.executable, TOOL, src, dst], capture_output=True, text=True)


def main():
    argparse.ArgumentParser().parse_known_args()  # run_python_test.sh passes --bin
    # A umask under which 0600 (mkstemp's mode, kept before the fix) is not the right answer.
    os.umask(0o022)
    with tempfile.TemporaryDirectory() as tmp:
        for method in ("eagle", "medusa"):
            src = os.path.join(HEADS, f"{method}-smollm2-135m.gguf")
            committed = os.path.join(HEADS, f"{method}-smollm2-135m.q8_0.gguf")
            out = os.path.join(tmp, f"{method}.q8_0.gguf")
            r = run_tool(src, out)
            check(r.returncode == 0, f"{method}: quantize_head.py exits 0 ({r.stderr.strip()[-200:]})")
            if r.returncode != 0:
                continue
            with open(out, "rb") as a, open(committed, "rb") as b:
                check(a.read() == b.read(), f"{method}: output is byte for byte the committed {os.path.basename(committed)}")
            # The mode a plain open() gives (0666 less the umask); it was mkstemp's 0600.
            umask = os.umask(0)
            os.umask(umask)
            mode = os.stat(out).st_mode & 0o777
            check(mode == 0o666 & ~umask, f"{method}: output mode {oct(mode)} is 0666 less the umask {oct(umask)}")
            f16, q8 = GGUFReader(src), GGUFReader(out)
            keys16 = {f.name: (f.types, f.contents()) for f in f16.fields.values() if not f.name.startswith("GGUF.")}
            keys8 = {f.name: (f.types, f.contents()) for f in q8.fields.values() if not f.name.startswith("GGUF.")}
            check(all(keys8.get(k) == v for k, v in keys16.items()),
                  f"{method}: every metadata key kept with its type (fingerprint included)")
            t16 = {t.name: t for t in f16.tensors}
            check(sorted(t16) == sorted(t.name for t in q8.tensors), f"{method}: the same tensors")
            for t in q8.tensors:
                a = t16[t.name]
                if len(a.shape) == 2:
                    check(t.tensor_type == Q.Q8_0, f"{method}: {t.name} is Q8_0")
                    w = np.asarray(a.data).astype(np.float32)
                    back = quants.dequantize(np.asarray(t.data), Q.Q8_0).reshape(w.shape)
                    blocks = np.abs(w.reshape(-1, 32)).max(axis=1, keepdims=True)
                    err = np.abs((back - w).reshape(-1, 32))
                    # half a quantisation step (d / 2 = amax / 254), plus the fp16 rounding of d
                    # (relative 2^-11) times |q| <= 127: amax * 2^-11
                    bound = blocks / 254 + blocks * 2.0 ** -11 + 1e-12
                    check(bool((err <= bound).all()), f"{method}: {t.name} within amax/254 (+ fp16 scale rounding) of F16")
                else:
                    check(t.tensor_type == a.tensor_type and np.array_equal(np.asarray(t.data), np.asarray(a.data)),
                          f"{method}: vector {t.name} copied unchanged")
        same = os.path.join(tmp, "same.gguf")
        shutil.copy(os.path.join(HEADS, "medusa-smollm2-135m.gguf"), same)
        r = run_tool(same, same)
        with open(same, "rb") as a, open(os.path.join(HEADS, "medusa-smollm2-135m.gguf"), "rb") as b:
            check(r.returncode == 1 and "is the input file" in r.stderr and a.read() == b.read(),
                  "the input as output is refused and left intact")
        # An input named like a temporary of the output (the tool once wrote OUT + ".tmp").
        like_tmp = os.path.join(tmp, "h.gguf.tmp")
        shutil.copy(os.path.join(HEADS, "medusa-smollm2-135m.gguf"), like_tmp)
        r = run_tool(like_tmp, os.path.join(tmp, "h.gguf"))
        with open(like_tmp, "rb") as a, open(os.path.join(HEADS, "medusa-smollm2-135m.gguf"), "rb") as b:
            check(r.returncode == 0 and a.read() == b.read(), "an input named OUT.tmp is read, not overwritten")
        r = run_tool(same, tmp)
        check(r.returncode == 1 and "is a directory" in r.stderr, "a directory as the output is refused")
        r = run_tool(same, os.path.join(tmp, "no", "such", "x.gguf"))
        check(r.returncode == 1 and "does not exist" in r.stderr, "an output in a missing folder is refused")
        check(not any(n.endswith(".part") for n in os.listdir(tmp)), "no temporary file is left behind")
        junk = os.path.join(tmp, "junk.gguf")
        with open(junk, "wb") as fh:
            fh.write(b"not a gguf file at all")
        r = run_tool(junk, os.path.join(tmp, "x.gguf"))
        check(r.returncode == 1 and "not a readable GGUF" in r.stderr and junk in r.stderr, "a non-GGUF input is refused, named")
        model = os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
        if os.path.exists(model):
            r = run_tool(model, os.path.join(tmp, "y.gguf"))
            check(r.returncode == 1 and "general.architecture = 'llama'" in r.stderr, "a target model is refused as not a head")
        else:
            print(f"skip: {model} not fetched (scripts/fetch-model.sh)")
    if failures:
        print(f"{len(failures)} check(s) failed")
        sys.exit(1)
    print("all checks passed")


if __name__ == "__main__":
    main()
