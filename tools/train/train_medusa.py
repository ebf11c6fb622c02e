#!/usr/bin/env python3
"""Trains Medusa-1 heads (Cai et al. 2024, "Medusa: Simple LLM Inference Acceleration Framework
with Multiple Decoding Heads", sec. 2.2.1: heads on a frozen backbone) on a `specserve
dump-hidden` directory and exports them as GGUF (docs: /work/notes contract section D,
models/heads/README.md).

Head i (0-based): h_i = h + SiLU(W_i h + b_i); logits_i = target output_head(h_i), the output head
shared and frozen. With h the target's final-norm hidden state at position p, head i predicts
the token at position p + 2 + i (the output head itself predicts p + 1). Loss: sum_i 0.8^i *
CE_i against the target's own greedy tokens (self-distillation), on continuation positions.
W_i starts at zero, so every head starts as the target's own next-token prediction.

Usage: train_medusa.py --dump DIR --out medusa.gguf [--epochs 10] [--curves PREFIX] [--threads 2]
"""
import argparse
import json
import os
import sys
import time

try:
    import numpy as np
    import torch
except ImportError:  # --help works without PyTorch; a run says where to get it
    if "-h" in sys.argv[1:] or "--help" in sys.argv[1:]:
        print(__doc__)
        sys.exit(0)
    sys.exit("train_medusa.py: needs PyTorch and NumPy: run it with the python that tools/train/venv.sh prints "
             "(tools/train/train_all.sh does)")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402


class MedusaHeads(torch.nn.Module):
    def __init__(self, d, num_heads):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(num_heads, d, d))  # [K, out d, in d]
        self.b = torch.nn.Parameter(torch.zeros(num_heads, d))  # [K, d]

    def forward(self, h):
        """h [n, d] -> [K, n, d]: each head's residual-block output (input of the output head)."""
        z = torch.einsum("koi,ni->kno", self.w, h) + self.b[:, None, :]
        return h[None] + torch.nn.functional.silu(z)


def build_examples(dump, seq_ids, num_heads):
    """(X [M, d], Y [M, K]): hidden at each continuation position p (from the last prompt token
    on) and the greedy tokens at p+2..p+1+K (IGNORE past the end)."""
    xs, ys = [], []
    for i in seq_ids:
        s = dump.seqs[i]
        o, n, pl = s["offset"], s["length"], s["prompt_length"]
        ext = dump.extended_tokens(i)  # [n + 1]
        ps = torch.arange(pl - 1, n - 1)  # head 0's label p + 2 <= n exists
        if len(ps) == 0:
            continue
        y = torch.full((len(ps), num_heads), common.IGNORE, dtype=torch.long)
        for k in range(num_heads):
            t = ps + 2 + k
            ok = t <= n
            y[ok, k] = ext[t[ok]]
        xs.append(dump.hidden[o + ps])
        ys.append(y)
    return torch.cat(xs), torch.cat(ys)


def evaluate(model, X, Y, head, num_heads):
    with torch.no_grad():
        out = {}
        hs = torch.cat([model(X[s:s + 2048]) for s in range(0, len(X), 2048)], dim=1)  # [K, M, d]
        for k in range(num_heads):
            c, n = common.full_top1(hs[k], Y[:, k], head)
            out[f"top1_head{k}"] = c / max(1, n)
    return out


def export(model, path, dump, num_heads):
    w = common.gguf_writer(path, "medusa")
    w.add_uint32("medusa.num_heads", num_heads)
    w.add_uint32("medusa.hidden_size", dump.d)
    w.add_uint32("medusa.vocab_size", dump.vocab)
    w.add_string("medusa.target_fingerprint", dump.fingerprint)
    for i in range(num_heads):
        common.add_weight(w, f"medusa.{i}.weight", model.w[i])
        common.add_f32(w, f"medusa.{i}.bias", model.b[i])
    common.finish_gguf(w)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--dump", required=True, nargs="+", help="specserve dump-hidden output directory (several: concatenated)")
    ap.add_argument("--out", required=True, help="output GGUF path")
    ap.add_argument("--num-heads", type=int, default=4)
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--batch", type=int, default=512, help="positions per step")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--weight-decay", type=float, default=0.0)
    ap.add_argument("--decay", type=float, default=0.8, help="loss weight of head i is decay^i (Medusa: 0.8)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-minutes", type=float, default=20.0, help="stop training after this wall time")
    ap.add_argument("--curves", default="", help="write PREFIX.json and PREFIX.png (loss / top-1 curves)")
    ap.add_argument("--save-torch", default="", help="also save the trained state_dict (.pt) here")
    a = ap.parse_args()
    common.setup_threads(a.threads)
    t_start = time.time()
    dump = common.Dump(a.dump)
    tr_ids, va_ids = dump.split()
    Xtr, Ytr = build_examples(dump, tr_ids, a.num_heads)
    Xva, Yva = build_examples(dump, va_ids, a.num_heads)
    sub = common.SubVocab(dump.head, Ytr)
    print(f"[medusa] {len(Xtr)} train / {len(Xva)} val positions ({len(tr_ids)}/{len(va_ids)} sequences); "
          f"CE over {len(sub.ids)} of {dump.vocab} token ids (those in the training labels)", flush=True)
    model = MedusaHeads(dump.d, a.num_heads)
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, weight_decay=a.weight_decay)
    steps_per_epoch = (len(Xtr) + a.batch - 1) // a.batch
    total = steps_per_epoch * a.epochs
    weights = [a.decay ** k for k in range(a.num_heads)]
    curves = common.Curves({"method": "medusa", "num_heads": a.num_heads, "epochs": a.epochs, "batch": a.batch,
                            "lr": a.lr, "train_positions": len(Xtr), "val_positions": len(Xva),
                            "ce_vocab": len(sub.ids), "dump": [os.path.abspath(x) for x in a.dump], "threads": a.threads})
    ev = evaluate(model, Xva, Yva, dump.head, a.num_heads)
    curves.val(epoch=0, **ev)
    print(f"[medusa] epoch 0 val " + " ".join(f"{k}={v:.3f}" for k, v in ev.items()), flush=True)
    step = 0
    g = torch.Generator().manual_seed(0)
    # Exported: the epoch with the best held-out accuracy summed over heads (the heads overfit
    # small data; later epochs can be worse).
    best = (sum(ev.values()), 0, {k: v.clone() for k, v in model.state_dict().items()})
    stopped = False
    for epoch in range(1, a.epochs + 1):
        perm = torch.randperm(len(Xtr), generator=g)
        t0 = time.time()
        run = {f"loss_head{k}": 0.0 for k in range(a.num_heads)}
        nb = 0
        for s in range(0, len(perm), a.batch):
            idx = perm[s:s + a.batch]
            for gr in opt.param_groups:
                gr["lr"] = common.cosine_lr(step, total, a.lr)
            hs = model(Xtr[idx])  # [K, B, d]
            losses = [sub.loss(hs[k], Ytr[idx, k]) for k in range(a.num_heads)]
            loss = sum(w * l for w, l in zip(weights, losses))
            opt.zero_grad()
            loss.backward()
            opt.step()
            step += 1
            nb += 1
            for k in range(a.num_heads):
                run[f"loss_head{k}"] += float(losses[k])
            if step % 10 == 0:
                curves.train(epoch=epoch - 1 + nb / steps_per_epoch, step=step, loss=float(loss),
                             **{f"loss_head{k}": float(losses[k]) for k in range(a.num_heads)})
            if (time.time() - t_start) / 60 > a.max_minutes:
                stopped = True
                break
        ev = evaluate(model, Xva, Yva, dump.head, a.num_heads)
        with torch.no_grad():
            hs = model(Xva)
            vl = {f"val_loss_head{k}": float(sub.loss(hs[k], Yva[:, k])) for k in range(a.num_heads)}
        curves.val(epoch=epoch if not stopped else epoch - 1 + nb / steps_per_epoch, **ev, **vl)
        if sum(ev.values()) > best[0]:
            best = (sum(ev.values()), epoch, {k: v.clone() for k, v in model.state_dict().items()})
        print(f"[medusa] epoch {epoch}/{a.epochs} {time.time() - t0:.0f}s train " +
              " ".join(f"{k}={v / max(1, nb):.3f}" for k, v in run.items()) + " | val " +
              " ".join(f"{k}={v:.3f}" for k, v in ev.items()), flush=True)
        if stopped:
            print(f"[medusa] time budget of {a.max_minutes} min reached: stopped in epoch {epoch}", flush=True)
            break
    elapsed = time.time() - t_start
    curves.data["meta"]["train_seconds"] = round(elapsed, 1)
    curves.data["meta"]["stopped_early"] = stopped
    model.load_state_dict(best[2])
    curves.data["meta"]["best_epoch"] = best[1]
    curves.data["final"] = curves.data["val"][best[1]]
    print(f"[medusa] exporting epoch {best[1]} (best held-out top-1 sum)", flush=True)
    if a.curves:
        curves.write(a.curves + ".json", a.curves + ".png", "Medusa-1 heads (SmolLM2-135M)",
                     ["loss"] + [f"loss_head{k}" for k in range(a.num_heads)] +
                     [f"val_loss_head{k}" for k in range(a.num_heads)],
                     [f"top1_head{k}" for k in range(a.num_heads)])
    if a.save_torch:
        torch.save(model.state_dict(), a.save_torch)
    export(model, a.out, dump, a.num_heads)
    print(f"[medusa] {elapsed / 60:.1f} min; wrote {a.out} ({os.path.getsize(a.out) / 1e6:.1f} MB); final val " +
          json.dumps({k: round(v, 4) for k, v in curves.data["final"].items() if k.startswith("top1")}), flush=True)


if __name__ == "__main__":
    main()
