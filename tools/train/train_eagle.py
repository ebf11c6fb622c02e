#!/usr/bin/env python3
"""Trains an EAGLE-1 draft head (Li et al. 2024, "EAGLE: Speculative Sampling Requires Rethinking
Feature Uncertainty") on a `specserve dump-hidden` directory and exports it as GGUF (contract
section D; models/heads/README.md).

Draft input at position p: x = fc(concat(embedding(token p), feature(p-1))), then one llama
decoder layer WITHOUT its input norm (EAGLE-1): x = x + attn(x); x = x + mlp(ffn_norm(x)). The
output (no final norm) is the predicted feature(p); logits = the target's frozen output head
applied to it. Features are the target's final-norm hidden states. Attention: grouped-query, the
target's head counts, RoPE at the token positions with the runtime's pairing (model/backend.h:
neox=false rotates pairs (2i, 2i+1); theta_i = pos * freq_base^(-2i/rope_dim)).
Loss (EAGLE-1): smooth-L1(predicted feature, target feature) + 0.1 * CE(output_head(predicted),
the target's greedy next token); input features get uniform noise (EAGLE's U(-0.1, 0.1)
augmentation, here scaled to the features' RMS).

Usage: train_eagle.py --dump DIR --out eagle.gguf [--epochs 8] [--curves PREFIX] [--threads 2]
"""
import argparse
import json
import math
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402


def rope(x, pos, theta, rope_dim):
    """x [B, T, H, hd], pos [B, T] -> x rotated in pairs (2i, 2i+1) of its first rope_dim dims."""
    half = rope_dim // 2
    inv = theta ** (-2.0 * torch.arange(half, dtype=torch.float64) / rope_dim)  # [half]
    ang = (pos.to(torch.float64)[..., None] * inv).to(torch.float32)  # [B, T, half]
    c, s = torch.cos(ang)[:, :, None, :], torch.sin(ang)[:, :, None, :]
    xr = x[..., :rope_dim].reshape(*x.shape[:-1], half, 2)
    x0, x1 = xr[..., 0], xr[..., 1]
    out = torch.stack([x0 * c - x1 * s, x0 * s + x1 * c], dim=-1).reshape(*x.shape[:-1], rope_dim)
    return torch.cat([out, x[..., rope_dim:]], dim=-1)


class EagleHead(torch.nn.Module):
    def __init__(self, cfg):
        super().__init__()
        d, ff = cfg["hidden_size"], cfg["ffn_size"]
        self.d, self.H, self.KV = d, cfg["num_heads"], cfg["num_kv_heads"]
        self.hd = d // self.H
        self.rope_dim = min(int(cfg.get("rope_dim") or self.hd), self.hd)
        self.theta, self.eps = float(cfg["rope_theta"]), float(cfg["norm_eps"])
        self.fc = torch.nn.Linear(2 * d, d, bias=True)
        self.wq = torch.nn.Linear(d, self.H * self.hd, bias=False)
        self.wk = torch.nn.Linear(d, self.KV * self.hd, bias=False)
        self.wv = torch.nn.Linear(d, self.KV * self.hd, bias=False)
        self.wo = torch.nn.Linear(self.H * self.hd, d, bias=False)
        self.ffn_norm = torch.nn.Parameter(torch.ones(d))
        self.gate = torch.nn.Linear(d, ff, bias=False)
        self.up = torch.nn.Linear(d, ff, bias=False)
        self.down = torch.nn.Linear(ff, d, bias=False)

    def forward(self, emb, feat, pos):
        """emb, feat [B, T, d] (token embedding at p, feature at p-1), pos [B, T] -> feature [B, T, d].
        Causal attention within each row of the batch (padding only at the end)."""
        B, T, _ = emb.shape
        x = self.fc(torch.cat([emb, feat], dim=-1))
        q = rope(self.wq(x).view(B, T, self.H, self.hd), pos, self.theta, self.rope_dim)
        k = rope(self.wk(x).view(B, T, self.KV, self.hd), pos, self.theta, self.rope_dim)
        v = self.wv(x).view(B, T, self.KV, self.hd)
        g = self.H // self.KV  # query head h uses kv head h // g (the runtime's grouping)
        k = k.repeat_interleave(g, dim=2)
        v = v.repeat_interleave(g, dim=2)
        att = torch.einsum("bthd,bshd->bhts", q, k) / math.sqrt(self.hd)
        mask = torch.ones(T, T, dtype=torch.bool).triu(1)
        att = att.masked_fill(mask, float("-inf")).softmax(-1)
        o = torch.einsum("bhts,bshd->bthd", att, v).reshape(B, T, self.H * self.hd)
        x = x + self.wo(o)
        n = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.ffn_norm
        return x + self.down(F.silu(self.gate(n)) * self.up(n))


class Batches:
    """Whole sequences, bucketed by length: per sequence, rows p = 1..L-1 (position p, token p,
    feature p-1 as input; feature p and argmax p as targets)."""

    def __init__(self, dump, seq_ids, max_rows):
        self.dump, self.max_rows = dump, max_rows
        self.ids = sorted(seq_ids, key=lambda i: dump.seqs[i]["length"])

    def batches(self, gen=None):
        out, cur, cur_T = [], [], 0
        for i in self.ids:
            T = self.dump.seqs[i]["length"] - 1
            if cur and max(cur_T, T) * (len(cur) + 1) > self.max_rows:
                out.append(cur)
                cur, cur_T = [], 0
            cur.append(i)
            cur_T = max(cur_T, T)
        if cur:
            out.append(cur)
        if gen is not None:
            out = [out[j] for j in torch.randperm(len(out), generator=gen).tolist()]
        return out

    def tensors(self, ids):
        d = self.dump
        T = max(d.seqs[i]["length"] for i in ids) - 1
        B = len(ids)
        tok = torch.zeros(B, T, dtype=torch.long)
        feat_in = torch.zeros(B, T, d.d)
        feat_out = torch.zeros(B, T, d.d)
        label = torch.full((B, T), common.IGNORE, dtype=torch.long)
        pos = torch.zeros(B, T, dtype=torch.long)
        mask = torch.zeros(B, T)
        for b, i in enumerate(ids):
            o, L = d.seqs[i]["offset"], d.seqs[i]["length"]
            n = L - 1
            tok[b, :n] = d.tokens[o + 1:o + L]
            feat_in[b, :n] = d.hidden[o:o + L - 1]
            feat_out[b, :n] = d.hidden[o + 1:o + L]
            label[b, :n] = d.argmax[o + 1:o + L]
            pos[b, :n] = torch.arange(1, L)
            pos[b, n:] = torch.arange(L, L + T - n)
            mask[b, :n] = 1
        return tok, feat_in, feat_out, label, pos, mask


def losses(model, dump, sub, tok, feat_in, feat_out, label, pos, mask, noise=0.0):
    x = feat_in
    if noise > 0:
        x = x + (torch.rand_like(x) - 0.5) * 2 * noise
    pred = model(dump.embed[tok], x, pos)
    m = mask.sum()
    vloss = (F.smooth_l1_loss(pred, feat_out, reduction="none").mean(-1) * mask).sum() / m
    ploss = sub.loss(pred, label)
    return pred, vloss, ploss


def evaluate(model, dump, sub, data):
    """Held-out: losses, 1-step top-1 (teacher-forced features) and an approximate 2-step top-1
    (every input feature replaced by the head's own prediction of it), full output head.

    NOTE: both are per-position accuracies over every row, prompt rows included, with the true
    token as input: top1_step2 is close to P(depth 2 right | depth 1 right), not to what
    `bench-spec` reports as acceptance at depth 2 (P(depth 1 and depth 2 accepted)). The real
    multi-step numbers (own features fed back, own KV, continuation positions only) come from
    tools/train/eagle_chain_reference.py (bench/results/eagle_depth_2026-12-02.md)."""
    tot = {"v": 0.0, "p": 0.0, "n": 0}
    c1 = n1 = c2 = n2 = 0
    with torch.no_grad():
        for ids in data.batches():
            tok, fi, fo, lab, pos, mask = data.tensors(ids)
            pred, v, p = losses(model, dump, sub, tok, fi, fo, lab, pos, mask)
            tot["v"] += float(v) * len(ids)
            tot["p"] += float(p) * len(ids)
            tot["n"] += len(ids)
            valid = mask.bool()
            c, n = common.full_top1(pred[valid], lab[valid], dump.head)
            c1, n1 = c1 + c, n1 + n
            # 2-step: the input feature at p is the head's prediction of feature(p-1).
            fi2 = fi.clone()
            fi2[:, 1:] = pred[:, :-1]
            pred2 = model(dump.embed[tok], fi2, pos)
            v2 = valid.clone()
            v2[:, 0] = False
            c, n = common.full_top1(pred2[v2], lab[v2], dump.head)
            c2, n2 = c2 + c, n2 + n
    return {"val_loss_feature": tot["v"] / tot["n"], "val_loss_token": tot["p"] / tot["n"],
            "top1_step1": c1 / max(1, n1), "top1_step2": c2 / max(1, n2)}


def export(model, path, dump):
    cfg = dump.config
    w = common.gguf_writer(path, "eagle")
    w.add_uint32("eagle.hidden_size", dump.d)
    w.add_uint32("eagle.head_count", model.H)
    w.add_uint32("eagle.head_count_kv", model.KV)
    w.add_uint32("eagle.feed_forward_length", int(cfg["ffn_size"]))
    w.add_float32("eagle.rope.freq_base", model.theta)
    w.add_float32("eagle.layer_norm_rms_epsilon", model.eps)
    w.add_uint32("eagle.vocab_size", dump.vocab)
    w.add_string("eagle.target_fingerprint", dump.fingerprint)
    common.add_weight(w, "eagle.fc.weight", model.fc.weight)
    common.add_f32(w, "eagle.fc.bias", model.fc.bias)
    common.add_weight(w, "blk.0.attn_q.weight", model.wq.weight)
    common.add_weight(w, "blk.0.attn_k.weight", model.wk.weight)
    common.add_weight(w, "blk.0.attn_v.weight", model.wv.weight)
    common.add_weight(w, "blk.0.attn_output.weight", model.wo.weight)
    common.add_f32(w, "blk.0.ffn_norm.weight", model.ffn_norm)
    common.add_weight(w, "blk.0.ffn_gate.weight", model.gate.weight)
    common.add_weight(w, "blk.0.ffn_up.weight", model.up.weight)
    common.add_weight(w, "blk.0.ffn_down.weight", model.down.weight)
    common.finish_gguf(w)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--dump", required=True, nargs="+", help="specserve dump-hidden output directory (several: concatenated)")
    ap.add_argument("--out", required=True, help="output GGUF path")
    ap.add_argument("--epochs", type=int, default=8)
    ap.add_argument("--rows", type=int, default=2048, help="padded positions per step (batch of whole sequences)")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--token-weight", type=float, default=0.1, help="weight of the CE term (EAGLE: 0.1)")
    ap.add_argument("--noise", type=float, default=0.1, help="uniform noise half-width, times the features' RMS")
    ap.add_argument("--clip", type=float, default=0.5, help="gradient norm clip (EAGLE: 0.5)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-minutes", type=float, default=20.0, help="stop training after this wall time")
    ap.add_argument("--curves", default="", help="write PREFIX.json and PREFIX.png (loss / top-1 curves)")
    ap.add_argument("--save-torch", default="", help="also save the trained state_dict (.pt) here")
    a = ap.parse_args()
    common.setup_threads(a.threads)
    t_start = time.time()
    dump = common.Dump(a.dump)
    tr_ids, va_ids = dump.split()
    train, val = Batches(dump, tr_ids, a.rows), Batches(dump, va_ids, a.rows)
    labels = torch.cat([dump.argmax[s["offset"]:s["offset"] + s["length"]] for s in (dump.seqs[i] for i in tr_ids)])
    sub = common.SubVocab(dump.head, labels)
    rms = float(dump.hidden.pow(2).mean().sqrt())
    noise = a.noise * rms
    model = EagleHead(dump.config)
    nparam = sum(p.numel() for p in model.parameters())
    print(f"[eagle] {nparam / 1e6:.2f} M parameters; {len(tr_ids)}/{len(va_ids)} train/val sequences; feature RMS "
          f"{rms:.3f}, noise +-{noise:.3f}; CE over {len(sub.ids)} of {dump.vocab} token ids", flush=True)
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, betas=(0.9, 0.95), weight_decay=0.0)
    g = torch.Generator().manual_seed(0)
    steps_per_epoch = len(train.batches())
    total = steps_per_epoch * a.epochs
    curves = common.Curves({"method": "eagle", "epochs": a.epochs, "rows_per_step": a.rows, "lr": a.lr,
                            "token_weight": a.token_weight, "noise": a.noise, "params": nparam,
                            "train_sequences": len(tr_ids), "val_sequences": len(va_ids),
                            "ce_vocab": len(sub.ids), "dump": [os.path.abspath(x) for x in a.dump], "threads": a.threads})
    ev = evaluate(model, dump, sub, val)
    curves.val(epoch=0, **ev)
    print("[eagle] epoch 0 val " + " ".join(f"{k}={v:.3f}" for k, v in ev.items()), flush=True)
    step, stopped = 0, False
    # Exported: the epoch with the best held-out top1_step1 + top1_step2.
    score = lambda e: e["top1_step1"] + e["top1_step2"]  # noqa: E731
    best = (score(ev), 0, {k: v.clone() for k, v in model.state_dict().items()})
    for epoch in range(1, a.epochs + 1):
        t0 = time.time()
        sv = sp = 0.0
        nb = 0
        for ids in train.batches(g):
            for gr in opt.param_groups:
                gr["lr"] = common.cosine_lr(step, total, a.lr)
            _, v, p = losses(model, dump, sub, *train.tensors(ids), noise=noise)
            loss = v + a.token_weight * p
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), a.clip)
            opt.step()
            step += 1
            nb += 1
            sv += float(v)
            sp += float(p)
            if step % 5 == 0:
                curves.train(epoch=epoch - 1 + nb / steps_per_epoch, step=step, loss=float(loss),
                             loss_feature=float(v), loss_token=float(p))
            if (time.time() - t_start) / 60 > a.max_minutes:
                stopped = True
                break
        ev = evaluate(model, dump, sub, val)
        curves.val(epoch=epoch if not stopped else epoch - 1 + nb / steps_per_epoch, **ev)
        if score(ev) > best[0]:
            best = (score(ev), epoch, {k: v.clone() for k, v in model.state_dict().items()})
        print(f"[eagle] epoch {epoch}/{a.epochs} {time.time() - t0:.0f}s train feature={sv / nb:.4f} "
              f"token={sp / nb:.3f} | val " + " ".join(f"{k}={v:.3f}" for k, v in ev.items()), flush=True)
        if stopped:
            print(f"[eagle] time budget of {a.max_minutes} min reached: stopped in epoch {epoch}", flush=True)
            break
    elapsed = time.time() - t_start
    curves.data["meta"]["train_seconds"] = round(elapsed, 1)
    curves.data["meta"]["stopped_early"] = stopped
    model.load_state_dict(best[2])
    curves.data["meta"]["best_epoch"] = best[1]
    curves.data["final"] = curves.data["val"][best[1]]
    print(f"[eagle] exporting epoch {best[1]} (best held-out top-1)", flush=True)
    if a.curves:
        curves.write(a.curves + ".json", a.curves + ".png", "EAGLE-1 head (SmolLM2-135M)",
                     ["loss", "loss_feature", "loss_token", "val_loss_feature", "val_loss_token"],
                     ["top1_step1", "top1_step2"])
    if a.save_torch:
        torch.save(model.state_dict(), a.save_torch)
    export(model, a.out, dump)
    print(f"[eagle] {elapsed / 60:.1f} min; wrote {a.out} ({os.path.getsize(a.out) / 1e6:.1f} MB); final val " +
          json.dumps({k: round(v, 4) for k, v in curves.data["final"].items() if k.startswith("top1")}), flush=True)


if __name__ == "__main__":
    main()
