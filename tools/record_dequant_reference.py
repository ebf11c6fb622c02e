#!/usr/bin/env python3
"""Records reference dequantisation data for tests/model/dequant_test.cpp.

The reference is the `gguf` Python package (gguf-py, from llama.cpp): gguf.quants.dequantize.
For each GGML type this writes, under tests/data/dequant/:
  <TYPE>.bin  raw bytes: 8 random blocks (256 random elements for F32, F16, BF16)
  <TYPE>.f32  the reference output, little-endian float32

Random bytes everywhere, except that fp16 scale fields (d, m, dmin) are overwritten with a
random value in [-2, 2] so outputs stay finite, and F32 input is random normal values (random
F32 bytes would be mostly huge or NaN). F16 and BF16 input is random bits, NaN and Inf included.

Produced with (gguf 0.19.0, numpy 2.4.6, seed 20240611):
  ~/.cache/specserve/venv/bin/python tools/record_dequant_reference.py
"""
import os
import sys

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import GGML_QUANT_SIZES
from gguf.quants import dequantize

SEED = 20240611
NUM_BLOCKS = 8
NUM_FLOAT_ELEMENTS = 256

# Byte offsets of the fp16 scale fields inside one block (ggml-common.h).
FP16_FIELDS = {
    T.Q4_0: [0], T.Q4_1: [0, 2], T.Q5_0: [0], T.Q5_1: [0, 2], T.Q8_0: [0],
    T.Q2_K: [80, 82], T.Q3_K: [108], T.Q4_K: [0, 2], T.Q5_K: [0, 2], T.Q6_K: [208],
}
FLOAT_TYPES = [T.F32, T.F16, T.BF16]


def make_input(rng, qtype):
    if qtype == T.F32:
        return rng.standard_normal(NUM_FLOAT_ELEMENTS).astype("<f4").view(np.uint8)
    if qtype in (T.F16, T.BF16):
        return rng.integers(0, 256, NUM_FLOAT_ELEMENTS * 2, dtype=np.uint8)
    _, type_size = GGML_QUANT_SIZES[qtype]
    blocks = rng.integers(0, 256, (NUM_BLOCKS, type_size), dtype=np.uint8)
    for off in FP16_FIELDS[qtype]:
        scale = rng.uniform(-2.0, 2.0, NUM_BLOCKS).astype("<f2").view(np.uint8).reshape(NUM_BLOCKS, 2)
        blocks[:, off:off + 2] = scale
    return blocks.reshape(-1)


def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out_dir = os.path.join(root, "tests", "data", "dequant")
    os.makedirs(out_dir, exist_ok=True)
    rng = np.random.default_rng(SEED)
    for qtype in FLOAT_TYPES + list(FP16_FIELDS):
        raw = make_input(rng, qtype)
        if qtype == T.BF16:
            # NOTE: dequantize() views BF16 bytes by block, so give it the byte shape it expects.
            ref = dequantize(raw.reshape(1, -1), qtype).reshape(-1)
        else:
            ref = dequantize(raw.copy(), qtype).reshape(-1)
        ref = np.ascontiguousarray(ref, dtype="<f4")
        with open(os.path.join(out_dir, qtype.name + ".bin"), "wb") as f:
            f.write(raw.tobytes())
        with open(os.path.join(out_dir, qtype.name + ".f32"), "wb") as f:
            f.write(ref.tobytes())
        print(f"{qtype.name}: {raw.size} bytes -> {ref.size} floats", file=sys.stderr)


if __name__ == "__main__":
    main()
