#!/usr/bin/env python3
"""Writes tests/data/heads_reference.json: what the exported Medusa and EAGLE head files compute
in PyTorch on a few fixed target hidden states from a dump, for testing the C++ loader/runtime
against (format: models/heads/README.md, "heads_reference.json").

The heads are read back from the GGUF files themselves (F16 weights as stored), so the
reference is what a correct loader must reproduce, not the float32 weights before export.

Usage: make_reference.py --dump DIR --medusa medusa.gguf --eagle eagle.gguf --out heads_reference.json
"""
import argparse
import json
import os
import sys

try:
    import numpy as np
    import torch
except ImportError:  # --help works without PyTorch; a run says where to get it
    if "-h" in sys.argv[1:] or "--help" in sys.argv[1:]:
        print(__doc__)
        sys.exit(0)
    sys.exit("make_reference.py: needs PyTorch and NumPy: run it with the python that tools/train/venv.sh prints "
             "(tools/train/train_all.sh does)")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
from train_eagle import EagleHead  # noqa: E402
from train_medusa import MedusaHeads  # noqa: E402


def read_gguf(path):
    import gguf
    r = gguf.GGUFReader(path)
    meta = {}
    for k, f in r.fields.items():
        if k.startswith("GGUF."):
            continue
        if f.types and f.types[0] == gguf.GGUFValueType.STRING:
            meta[k] = bytes(f.parts[f.data[0]]).decode()
        else:
            meta[k] = f.parts[f.data[0]].tolist()[0]
    # numpy shape is the GGUF shape reversed: [out, in] for weights, as torch stores them.
    tensors = {t.name: torch.from_numpy(np.array(t.data, dtype=np.float32).reshape(list(reversed(t.shape.tolist()))))
               for t in r.tensors}
    return meta, tensors


def load_eagle_head(path, target_config):
    """The EAGLE head of an exported GGUF (its own F16 weights) as a train_eagle.EagleHead, with
    the target's config (a dict) overridden by the head's shape keys. Returned in train mode: callers
    that draft call .eval()."""
    em, et = read_gguf(path)
    cfg = dict(target_config)
    cfg.update(hidden_size=int(em["eagle.hidden_size"]), num_heads=int(em["eagle.head_count"]),
               num_kv_heads=int(em["eagle.head_count_kv"]), ffn_size=int(em["eagle.feed_forward_length"]),
               rope_theta=float(em["eagle.rope.freq_base"]), norm_eps=float(em["eagle.layer_norm_rms_epsilon"]))
    eg = EagleHead(cfg)
    names = {"fc.weight": "eagle.fc.weight", "fc.bias": "eagle.fc.bias", "wq.weight": "blk.0.attn_q.weight",
             "wk.weight": "blk.0.attn_k.weight", "wv.weight": "blk.0.attn_v.weight",
             "wo.weight": "blk.0.attn_output.weight", "ffn_norm": "blk.0.ffn_norm.weight",
             "gate.weight": "blk.0.ffn_gate.weight", "up.weight": "blk.0.ffn_up.weight",
             "down.weight": "blk.0.ffn_down.weight"}
    eg.load_state_dict({k: et[v] for k, v in names.items()})
    return eg


def top5(h, head):
    logits = h @ head.T
    v, i = logits.topk(5)
    return i.tolist(), [round(float(x), 4) for x in v]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dump", required=True, nargs="+")
    ap.add_argument("--medusa", required=True)
    ap.add_argument("--eagle", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--command", default="", help="the command that produced the files (recorded)")
    a = ap.parse_args()
    torch.set_num_threads(2)
    dump = common.Dump(a.dump)
    _, va = dump.split()
    # Fixed positions: continuation rows of the first held-out sequences.
    picks = []
    for i in va[:3]:
        s = dump.seqs[i]
        picks.append((i, s["offset"], s["prompt_length"] + 5))  # 6th continuation token's position

    mm, mt = read_gguf(a.medusa)
    K = int(mm["medusa.num_heads"])
    med = MedusaHeads(dump.d, K)
    with torch.no_grad():
        for k in range(K):
            med.w[k].copy_(mt[f"medusa.{k}.weight"])
            med.b[k].copy_(mt[f"medusa.{k}.bias"])
    mcases = []
    for i, o, p in picks:
        h = dump.hidden[o + p]
        with torch.no_grad():
            hs = med(h[None])[:, 0]  # [K, d]
        heads = [top5(hs[k], dump.head) for k in range(K)]
        base = top5(h, dump.head)
        ext = dump.extended_tokens(i)
        mcases.append({"sequence": i, "position": p, "hidden": [float(x) for x in h.tolist()],
                       "base_top5": base[0], "base_top5_logits": base[1],
                       "top5": [x[0] for x in heads], "top5_logits": [x[1] for x in heads],
                       "greedy_tokens_p2_to_p5": ext[p + 2:p + 2 + K].tolist()})

    eg = load_eagle_head(a.eagle, dump.config)
    ecases = []
    for (i, o, p), rows in zip(picks[:2], (3, 1)):
        ps = list(range(p, p + rows))
        toks = dump.tokens[[o + q for q in ps]]
        feats = dump.hidden[[o + q - 1 for q in ps]]  # feature(p-1) goes with token p
        with torch.no_grad():
            out = eg(dump.embed[toks][None], feats[None], torch.tensor(ps)[None])[0]  # [rows, d]
        res = [top5(out[r], dump.head) for r in range(rows)]
        ecases.append({"sequence": i, "positions": ps, "tokens": toks.tolist(),
                       "features": [[float(x) for x in f] for f in feats.tolist()],
                       "top5": [x[0] for x in res], "top5_logits": [x[1] for x in res],
                       "feature_out_first8": [[round(float(x), 5) for x in out[r, :8]] for r in range(rows)],
                       "target_argmax": dump.argmax[[o + q for q in ps]].tolist()})

    ref = {
        "format": "specserve-heads-reference/1",
        "description": "Top-5 token ids (and logits) of the exported heads on fixed target hidden states, computed in "
                       "PyTorch from the GGUF files' own (F16) weights; logits = the target output head (dequantized "
                       "token_embd, tied) applied in float32. See models/heads/README.md.",
        "command": a.command,
        "target_fingerprint": dump.fingerprint,
        "medusa_file": os.path.basename(a.medusa), "medusa_sha256": common.sha256(a.medusa),
        "eagle_file": os.path.basename(a.eagle), "eagle_sha256": common.sha256(a.eagle),
        "medusa": {"num_heads": K, "cases": mcases},
        "eagle": {"rope": {"pairs": "(2i, 2i+1)", "theta": eg.theta, "rope_dim": eg.rope_dim}, "cases": ecases},
    }
    with open(a.out, "w") as f:
        json.dump(ref, f, indent=1)
    print(f"[reference] wrote {a.out}: {len(mcases)} medusa cases, {len(ecases)} eagle cases")


if __name__ == "__main__":
    main()
