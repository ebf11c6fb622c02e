#!/usr/bin/env python3
"""Rewrites a Medusa or EAGLE head GGUF with its matrices in Q8_0 (llama-quantize's Q8_0, for heads).

Every 2-D tensor whose GGUF row length (shape[0], the input width) is a multiple of 32 and whose
type is F16 or F32 becomes Q8_0: per 32 consecutive values of a row, d = amax / 127 (fp16) and
q = round(x / d) as int8 (ggml's block_q8_0; PyPI `gguf`'s gguf.quants.quantize, the same code
llama.cpp's Python tools use). Vectors (biases, norms) and any other tensor are copied as they
are; every metadata key is copied (the target fingerprint included). The result is about 1.9x
smaller than F16 and, in specserve, runs as the target's own Q8_0 weights do (the GGUF blocks on
the CPU, the int8 kernel under SPECSERVE_CPU_MATMUL=vnni) instead of being expanded to fp32.

A quantised head drafts slightly different tokens; the output stays the target's (every draft is
verified). Error per weight: |w - w_q8| <= amax(block) / 254 (half a step) + amax(block) * 2^-11
(the fp16 rounding of the scale).

OUT is written to a new temporary file in OUT's folder and renamed over OUT only when complete
(a failed run leaves no partial file); IN and OUT must differ.

Usage: quantize_head.py IN.gguf OUT.gguf   (--help for this text). Prints OUT's sha256.
"""
import argparse
import hashlib
import os
import sys
import tempfile

import numpy as np


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("input", help="head GGUF (medusa or eagle architecture, F16 / F32 matrices)")
    ap.add_argument("output", help="where to write the Q8_0 head")
    a = ap.parse_args()
    import gguf
    from gguf import GGUFReader, GGUFValueType, GGMLQuantizationType as Q

    if os.path.exists(a.output) and os.path.exists(a.input) and os.path.samefile(a.input, a.output):
        sys.exit(f"quantize_head: {a.output} is the input file: write the Q8_0 head to another path")
    if os.path.isdir(a.output):
        sys.exit(f"quantize_head: {a.output} is a directory: name the output file")
    out_dir = os.path.dirname(os.path.abspath(a.output))
    if not os.path.isdir(out_dir):
        sys.exit(f"quantize_head: {a.output}: the folder {out_dir} does not exist")
    try:
        r = GGUFReader(a.input)
    except Exception as e:  # a missing, truncated or non-GGUF file
        sys.exit(f"quantize_head: {a.input}: not a readable GGUF file ({e})")
    arch_field = r.fields.get("general.architecture")
    arch = arch_field.contents() if arch_field is not None else None
    if arch not in ("medusa", "eagle"):
        sys.exit(f"quantize_head: {a.input}: general.architecture = {arch!r}; expected 'medusa' or 'eagle'")
    fd, tmp = tempfile.mkstemp(prefix=os.path.basename(a.output) + ".", suffix=".part", dir=out_dir)
    os.close(fd)
    try:
        write_q8(r, arch, tmp, a, gguf, GGUFValueType, Q)
        # mkstemp makes the file 0600, which os.replace keeps: give it the mode a plain open()
        # would (0666 less the umask), so a server running as another user can read the head.
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, a.output)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    h = hashlib.sha256()
    with open(a.output, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    n_q = sum(1 for t in r.tensors if len(t.shape) == 2 and int(t.shape[0]) % 32 == 0 and t.tensor_type in (Q.F16, Q.F32))
    print(f"[quantize_head] {a.output}: {n_q} matrices to Q8_0, sha256 {h.hexdigest()}", file=sys.stderr)
    print(h.hexdigest())


def write_q8(r, arch, tmp, a, gguf, GGUFValueType, Q):
    """Writes r's head with its matrices in Q8_0 to the path tmp (see the module docstring)."""
    w = gguf.GGUFWriter(tmp, arch)
    for f in r.fields.values():
        if f.name.startswith("GGUF.") or f.name == "general.architecture":
            continue
        if f.name == "general.alignment":  # the writer's own alignment, not a copied key
            w.add_custom_alignment(int(f.contents()))
            continue
        vtype = f.types[0]
        sub = f.types[1] if vtype == GGUFValueType.ARRAY and len(f.types) > 1 else None
        try:
            w.add_key_value(f.name, f.contents(), vtype, sub_type=sub)
        except (ValueError, TypeError) as e:  # e.g. an empty array, which the writer refuses
            sys.exit(f"quantize_head: {a.input}: metadata key {f.name} cannot be copied ({e})")
    w.add_string("general.quantized_by", "tools/train/quantize_head.py (Q8_0)")
    for t in r.tensors:
        data = np.asarray(t.data)
        kind = t.tensor_type
        if len(t.shape) == 2 and int(t.shape[0]) % 32 == 0 and kind in (Q.F16, Q.F32):
            x = data.astype(np.float32)  # numpy [rows, cols]: row o is output o
            qd = gguf.quants.quantize(x, Q.Q8_0)
            w.add_tensor(t.name, qd, raw_dtype=Q.Q8_0)
        else:
            w.add_tensor(t.name, data, raw_dtype=kind)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    main()
