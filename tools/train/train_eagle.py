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
Training-time unroll (--unroll N, default 2; EAGLE-3's "training-time test", cheap version): the
same loss, weighted --unroll-weight, on steps 2..N of the head fed its OWN predicted features as
at inference (EagleHead.unrolled: step s at position p takes the step-(s-1) output of p-1 and
attends to the teacher-forced context rows up to p-s+1 and to the chain's own earlier rows), so
that depth >= 2 is trained on the inputs it gets when drafting. --unroll 1 is EAGLE-1.
Exported epoch: the best held-out greedy chain acceptance at depth --select-depth (default 2,
unconditional, as bench-spec reports it; evaluate()), checked at the end against
tools/train/eagle_chain_reference.py's chain_stats on a few held-out sequences.

Usage: train_eagle.py --dump DIR --out eagle.gguf [--epochs 8] [--unroll 2] [--init head.gguf] [--curves PREFIX]
         [--threads 2]
"""
import argparse
import json
import math
import os
import sys
import time

try:
    import torch
    import torch.nn.functional as F
except ImportError:  # --help works without PyTorch; a run says where to get it
    if "-h" in sys.argv[1:] or "--help" in sys.argv[1:]:
        print(__doc__)
        sys.exit(0)
    sys.exit("train_eagle.py: needs PyTorch: run it with the python that tools/train/venv.sh prints "
             "(tools/train/train_all.sh does)")

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
        return self.unrolled(emb, feat, pos, 1)[0]

    def _qkv(self, emb, feat, pos):
        B, T, _ = emb.shape
        x = self.fc(torch.cat([emb, feat], dim=-1))
        q = rope(self.wq(x).view(B, T, self.H, self.hd), pos, self.theta, self.rope_dim)
        k = rope(self.wk(x).view(B, T, self.KV, self.hd), pos, self.theta, self.rope_dim)
        v = self.wv(x).view(B, T, self.KV, self.hd)
        g = self.H // self.KV  # query head h uses kv head h // g (the runtime's grouping)
        return x, q, k.repeat_interleave(g, dim=2), v.repeat_interleave(g, dim=2)

    def _finish(self, x, o):
        B, T = x.shape[:2]
        x = x + self.wo(o.reshape(B, T, self.H * self.hd))
        n = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.ffn_norm
        return x + self.down(F.silu(self.gate(n)) * self.up(n))

    def unrolled(self, emb, feat, pos, steps):
        """The head unrolled `steps` times as EAGLE drafting runs it (EAGLE-3's "training-time
        test"): -> [out_1, ..., out_steps], each [B, T, d].

        Step 1 is the teacher-forced pass (feature(p-1) of the target as input). Step s >= 2 at
        row r (position pos[r], token emb[r]) takes the head's own step-(s-1) output of row r-1
        as its input feature -- what depth s of a chain drafted after position pos[r] - s + 1
        gets -- and attends as that chain row does at inference: to the step-1 rows r' <= r-s+1
        (the draft context, built from target features), to the step-j row r-(s-j) for each
        2 <= j < s (the chain's earlier drafted rows) and to itself. out_s[:, r] is meaningful
        for r >= s-1 only (mask the rest). With the true tokens as inputs, out_s at row r is what
        a greedy chain computes at depth s whenever its first s-1 drafts were right, so "steps
        1..D all correct" is exactly the chain's unconditional acceptance at depth D."""
        B, T, _ = emb.shape
        scale = 1.0 / math.sqrt(self.hd)
        x1, q1, k1, v1 = self._qkv(emb, feat, pos)
        att = torch.einsum("bthd,bshd->bhts", q1, k1) * scale
        att = att.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf")).softmax(-1)
        outs = [self._finish(x1, torch.einsum("bhts,bshd->bthd", att, v1))]
        ks, vs = [], []  # keys / values of steps 2.. (rows as computed, not shifted)
        for s in range(2, steps + 1):
            f = torch.cat([feat[:, :1], outs[-1][:, :-1]], dim=1)  # row r <- out_{s-1}[r-1]
            x, q, k, v = self._qkv(emb, f, pos)
            ks.append(k)
            vs.append(v)
            a1 = torch.einsum("bthd,bshd->bhts", q, k1) * scale  # [B, H, T, T] step-1 context
            a1 = a1.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(2 - s), float("-inf"))
            diag, vals = [], []
            for j in range(2, s + 1):  # the step-j row r-(s-j)
                sh = s - j
                kj = F.pad(ks[j - 2], (0, 0, 0, 0, sh, 0))[:, :T]  # row r <- k_j[r - sh]
                vj = F.pad(vs[j - 2], (0, 0, 0, 0, sh, 0))[:, :T]
                dj = (q * kj).sum(-1).transpose(1, 2) * scale  # [B, H, T]
                if sh > 0:
                    dj = dj.masked_fill((torch.arange(T) < sh)[None, None], float("-inf"))
                diag.append(dj[..., None])
                vals.append(vj)
            a = torch.cat([a1] + diag, dim=-1).softmax(-1)  # [B, H, T, T + s - 1]
            o = torch.einsum("bhts,bshd->bthd", a[..., :T], v1)
            for j, vj in enumerate(vals):
                o = o + a[..., T + j].transpose(1, 2)[..., None] * vj
            outs.append(self._finish(x, o))
        return outs


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


def losses(model, dump, sub, tok, feat_in, feat_out, label, pos, mask, noise=0.0, steps=1):
    """-> (outputs of steps 1..steps, [feature loss per step], [token CE per step]); step s is
    scored on rows r >= s-1 (rows with s-1 earlier positions to unroll from)."""
    x = feat_in
    if noise > 0:
        x = x + (torch.rand_like(x) - 0.5) * 2 * noise
    outs = model.unrolled(dump.embed[tok], x, pos, steps)
    vls, pls = [], []
    for s, pred in enumerate(outs, start=1):
        ms = mask.clone()
        ms[:, :s - 1] = 0
        lab = label.clone()
        lab[:, :s - 1] = common.IGNORE
        vls.append((F.smooth_l1_loss(pred, feat_out, reduction="none").mean(-1) * ms).sum() / ms.sum().clamp(min=1))
        pls.append(sub.loss(pred, lab))
    return outs, vls, pls


def chain_correct(outs, label, head, chunk=4096):
    """correct[s] [B, T] bool: the argmax over the FULL output head of step s+1's output at row r
    equals label r (padding / IGNORE rows: False)."""
    res = []
    with torch.no_grad():
        for out in outs:
            B, T, d = out.shape
            flat, lab = out.reshape(-1, d), label.reshape(-1)
            ok = torch.zeros(B * T, dtype=torch.bool)
            for c in range(0, B * T, chunk):
                m = lab[c:c + chunk] >= 0
                if m.any():
                    idx = torch.nonzero(m).squeeze(1) + c
                    ok[idx] = (flat[idx] @ head.T).argmax(-1) == lab[idx]
            res.append(ok.view(B, T))
    return res


def evaluate(model, dump, sub, data, depth=3, steps=1, token_weight=0.1):
    """Held-out: losses (step 1 and the trained unrolled steps), top-1 of step 1 over every row
    (teacher-forced features, full output head; as in earlier curves) and the greedy CHAIN
    acceptance by depth 1..depth: over chains started at every continuation position n
    (prompt_length <= n <= L - depth, as tools/train/eagle_chain_reference.py chain_stats), the
    share whose first j drafts all equal the target's greedy tokens -- unconditional, what
    `bench-spec` reports. Computed batched with EagleHead.unrolled (see its docstring for why
    that is the chain's acceptance); train_eagle checks it against chain_stats at the end."""
    import eagle_chain_reference as ecr  # here: it imports this module
    tot = {"v": 0.0, "p": 0.0, "n": 0}
    tot_s = [0.0] * steps
    c1 = n1 = 0
    full = [0] * (depth + 1)
    with torch.no_grad():
        for ids in data.batches():
            tok, fi, fo, lab, pos, mask = data.tensors(ids)
            outs, vls, pls = losses(model, dump, sub, tok, fi, fo, lab, pos, mask, steps=max(steps, depth))
            tot["v"] += float(vls[0]) * len(ids)
            tot["p"] += float(pls[0]) * len(ids)
            tot["n"] += len(ids)
            for s in range(steps):
                tot_s[s] += float(vls[s] + token_weight * pls[s]) * len(ids)
            valid = mask.bool()
            c, n = common.full_top1(outs[0][valid], lab[valid], dump.head)
            c1, n1 = c1 + c, n1 + n
            ok = chain_correct(outs[:depth], lab, dump.head)
            for b, i in enumerate(ids):
                sq = dump.seqs[i]
                acc = ecr.accepted_lengths(ok, b, sq["length"], depth)
                for n0 in range(max(sq["prompt_length"], 2), sq["length"] - depth + 1):
                    for q in range(acc[n0] + 1):
                        full[q] += 1
    chains = max(1, full[0])
    ev = {"val_loss_feature": tot["v"] / tot["n"], "val_loss_token": tot["p"] / tot["n"],
          "top1_step1": c1 / max(1, n1)}
    for s in range(1, steps):
        ev[f"val_loss_step{s + 1}"] = tot_s[s] / tot["n"]
    ev["chains"] = full[0]
    for j in range(1, depth + 1):
        ev[f"chain_acc_d{j}"] = full[j] / chains
    ev["chain_mean_accepted"] = sum(full[1:]) / chains
    return ev


def fmt(ev):
    return " ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in ev.items())


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
    ap.add_argument("--unroll", type=int, default=2,
                    help="steps of the head unrolled on its own features in the loss (1: teacher-forced only, EAGLE-1)")
    ap.add_argument("--unroll-weight", type=float, default=0.7, help="loss weight of each unrolled step >= 2")
    ap.add_argument("--eval-depth", type=int, default=3, help="held-out chain acceptance measured at depths 1..N")
    ap.add_argument("--select-depth", type=int, default=2, help="export the epoch with the best chain acceptance at this depth")
    ap.add_argument("--check-sequences", type=int, default=4,
                    help="at the end, compare the batched chain acceptance with eagle_chain_reference.chain_stats on "
                         "this many held-out sequences (0: skip)")
    ap.add_argument("--init", default="",
                    help="start from this exported EAGLE head (GGUF, its F16 weights) instead of a random init")
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
    if a.init:
        from make_reference import load_eagle_head  # here: make_reference imports this module
        model.load_state_dict(load_eagle_head(a.init, dump.config).state_dict())
        print(f"[eagle] initialised from {a.init} (sha256 {common.sha256(a.init)[:16]}...)", flush=True)
    nparam = sum(p.numel() for p in model.parameters())
    print(f"[eagle] {nparam / 1e6:.2f} M parameters; {len(tr_ids)}/{len(va_ids)} train/val sequences; feature RMS "
          f"{rms:.3f}, noise +-{noise:.3f}; CE over {len(sub.ids)} of {dump.vocab} token ids", flush=True)
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, betas=(0.9, 0.95), weight_decay=0.0)
    g = torch.Generator().manual_seed(0)
    steps_per_epoch = len(train.batches())
    total = steps_per_epoch * a.epochs
    curves = common.Curves({"method": "eagle", "epochs": a.epochs, "rows_per_step": a.rows, "lr": a.lr,
                            "token_weight": a.token_weight, "noise": a.noise, "params": nparam,
                            "unroll": a.unroll, "unroll_weight": a.unroll_weight, "eval_depth": a.eval_depth,
                            "select_depth": a.select_depth,
                            "init": (os.path.basename(a.init) + " sha256 " + common.sha256(a.init)) if a.init else "random",
                            "train_sequences": len(tr_ids), "val_sequences": len(va_ids),
                            "ce_vocab": len(sub.ids), "dump": [os.path.abspath(x) for x in a.dump], "threads": a.threads})
    evk = dict(depth=a.eval_depth, steps=a.unroll, token_weight=a.token_weight)
    ev = evaluate(model, dump, sub, val, **evk)
    curves.val(epoch=0, **ev)
    print("[eagle] epoch 0 val " + fmt(ev), flush=True)
    step, stopped = 0, False
    # Exported: the epoch with the best held-out chain acceptance at depth --select-depth
    # (unconditional; ties: the higher mean accepted drafts per chain).
    score = lambda e: (e[f"chain_acc_d{a.select_depth}"], e["chain_mean_accepted"])  # noqa: E731
    best = (score(ev), 0, {k: v.clone() for k, v in model.state_dict().items()})
    wts = [1.0] + [a.unroll_weight] * (a.unroll - 1)
    for epoch in range(1, a.epochs + 1):
        t0 = time.time()
        sv = [0.0] * a.unroll
        sp = [0.0] * a.unroll
        nb = 0
        for ids in train.batches(g):
            for gr in opt.param_groups:
                gr["lr"] = common.cosine_lr(step, total, a.lr)
            _, vls, pls = losses(model, dump, sub, *train.tensors(ids), noise=noise, steps=a.unroll)
            loss = sum(w * (v + a.token_weight * p) for w, v, p in zip(wts, vls, pls))
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), a.clip)
            opt.step()
            step += 1
            nb += 1
            for k in range(a.unroll):
                sv[k] += float(vls[k])
                sp[k] += float(pls[k])
            if step % 5 == 0:
                row = dict(epoch=epoch - 1 + nb / steps_per_epoch, step=step, loss=float(loss),
                           loss_feature=float(vls[0]), loss_token=float(pls[0]))
                for k in range(1, a.unroll):
                    row[f"loss_feature_step{k + 1}"] = float(vls[k])
                    row[f"loss_token_step{k + 1}"] = float(pls[k])
                curves.train(**row)
            if (time.time() - t_start) / 60 > a.max_minutes:
                stopped = True
                break
        ev = evaluate(model, dump, sub, val, **evk)
        curves.val(epoch=epoch if not stopped else epoch - 1 + nb / steps_per_epoch, **ev)
        if score(ev) > best[0]:
            best = (score(ev), epoch, {k: v.clone() for k, v in model.state_dict().items()})
        print(f"[eagle] epoch {epoch}/{a.epochs} {time.time() - t0:.0f}s train feature=" +
              "/".join(f"{x / nb:.4f}" for x in sv) + " token=" + "/".join(f"{x / nb:.3f}" for x in sp) +
              " | val " + fmt(ev), flush=True)
        if stopped:
            print(f"[eagle] time budget of {a.max_minutes} min reached: stopped in epoch {epoch}", flush=True)
            break
    elapsed = time.time() - t_start
    curves.data["meta"]["train_seconds"] = round(elapsed, 1)
    curves.data["meta"]["stopped_early"] = stopped
    model.load_state_dict(best[2])
    curves.data["meta"]["best_epoch"] = best[1]
    curves.data["final"] = curves.data["val"][best[1]]
    print(f"[eagle] exporting epoch {best[1]} (best held-out chain acceptance at depth {a.select_depth})", flush=True)
    if a.check_sequences > 0:
        # The batched chain acceptance of evaluate() against eagle_chain_reference.chain_stats (the
        # drafting loop itself, one chain at a time) on the first held-out sequences.
        import eagle_chain_reference as ecr
        model.eval()
        ids = va_ids[:a.check_sequences]
        ref = ecr.chain_stats(model, dump, ids, a.eval_depth, dump.head, proxy=False, simulate=False)
        mine = evaluate(model, dump, sub, Batches(dump, ids, a.rows), **evk)
        chk = {"sequences": ids, "chain_stats": {"chains": ref["chains"], "acceptance_by_depth": ref["acceptance_by_depth"]},
               "batched": {"chains": mine["chains"],
                           "acceptance_by_depth": [round(mine[f"chain_acc_d{j}"], 4) for j in range(1, a.eval_depth + 1)]}}
        curves.data["meta"]["chain_check"] = chk
        print(f"[eagle] chain check on {len(ids)} held-out sequences: " + json.dumps(chk), flush=True)
    if a.curves:
        curves.write(a.curves + ".json", a.curves + ".png", "EAGLE head (SmolLM2-135M)",
                     ["loss", "loss_feature", "loss_token", "loss_feature_step2", "loss_token_step2",
                      "val_loss_feature", "val_loss_token", "val_loss_step2"],
                     ["top1_step1"] + [f"chain_acc_d{j}" for j in range(1, a.eval_depth + 1)])
    if a.save_torch:
        torch.save(model.state_dict(), a.save_torch)
    export(model, a.out, dump)
    print(f"[eagle] {elapsed / 60:.1f} min; wrote {a.out} ({os.path.getsize(a.out) / 1e6:.1f} MB); final val " +
          json.dumps({k: round(v, 4) for k, v in curves.data["final"].items() if k.startswith(("top1", "chain"))}), flush=True)


if __name__ == "__main__":
    main()
