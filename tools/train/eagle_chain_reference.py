#!/usr/bin/env python3
"""Multi-step reference of EAGLE drafting: what the exported head drafts at inference, step by
step, as EAGLE-1/2 drafting does it (spec/eagle_proposer.cpp's contract), and how often the target
accepts it -- the number the trainer's "2-step proxy" (train_eagle.py evaluate: top1_step2) stands
in for.

Inference at a step with known tokens t_0..t_{n-1} (t_{n-1}: the last accepted / bonus token, whose
target feature f_{n-1} does not exist yet): the head's context rows are (token t_q, target feature
f_{q-1}, position q) for q = start..n-1, the last row's output g_{n-1} gives draft d_1 = argmax
head(g_{n-1}); depth j+1 appends the row (d_j, g of the previous row, position n-1+j) to the head's
own KV and takes its argmax. A greedy chain of `--depth` drafts from every continuation position of
every sequence of a dump; the target's greedy stream (dump tokens + argmax) says which are accepted.

Reported (JSON, --out): over chains from every continuation position, per depth j, the share of steps whose first j drafts all match (what
`bench-spec` calls acceptance at depth j: unconditional) and the conditional P(d_j ok | d_1..d_{j-1}
ok); beside it, the trainer's step-1 top-1 and its 2-step proxy over the same positions; and "simulated_run": the steps a greedy speculative run with a chain of
--depth makes over each continuation (n advances by the accepted drafts + 1 per step), as
`bench-spec` counts them.
--cases N also writes the first N chains (4 tokens into each continuation) of the sequences used with the head's context cut to a
window of --window rows (positions n-window..n-1) and the target features they need, for the C++
proposer test (tests/spec/eagle_chain_reference_test.cpp).

Usage: eagle_chain_reference.py --dump DIR [DIR...] --eagle eagle.gguf [--depth 4] [--draft-vocab 0]
         [--out stats.json] [--cases 0 --window 6 --cases-out chain_reference.json] [--command CMD]
"""
import argparse
import json
import math
import os
import sys

try:
    import torch
    import torch.nn.functional as F
except ImportError:  # --help works without PyTorch; a run says where to get it
    if "-h" in sys.argv[1:] or "--help" in sys.argv[1:]:
        print(__doc__)
        sys.exit(0)
    sys.exit("eagle_chain_reference.py: needs PyTorch: run it with the python that tools/train/venv.sh prints "
             "(tools/train/train_all.sh does)")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
from make_reference import load_eagle_head  # noqa: E402
from train_eagle import rope  # noqa: E402


def load_head(path, dump):
    """The exported head with the GGUF file's own (F16) weights."""
    return load_eagle_head(path, dump.config).eval()


class HeadKV:
    """EagleHead run incrementally with its own KV cache (one sequence): rows appended in order,
    each attending to every earlier row and itself (a chain: the tree's path)."""

    def __init__(self, m):
        self.m = m
        self.k = torch.zeros(0, m.KV, m.hd)
        self.v = torch.zeros(0, m.KV, m.hd)

    def truncate(self, n):
        self.k, self.v = self.k[:n], self.v[:n]

    def append(self, emb, feat, pos):
        """emb, feat [T, d], pos [T] -> output features [T, d]; their K/V join the cache."""
        m = self.m
        T = emb.shape[0]
        x = m.fc(torch.cat([emb, feat], dim=-1))
        q = rope(m.wq(x).view(1, T, m.H, m.hd), pos[None], m.theta, m.rope_dim)[0]
        k = rope(m.wk(x).view(1, T, m.KV, m.hd), pos[None], m.theta, m.rope_dim)[0]
        v = m.wv(x).view(T, m.KV, m.hd)
        P = self.k.shape[0]
        self.k = torch.cat([self.k, k])
        self.v = torch.cat([self.v, v])
        g = m.H // m.KV
        kk = self.k.repeat_interleave(g, dim=1)
        vv = self.v.repeat_interleave(g, dim=1)
        att = torch.einsum("thd,shd->hts", q, kk) / math.sqrt(m.hd)  # [H, T, P+T]
        mask = torch.ones(T, P + T, dtype=torch.bool).triu(P + 1)
        att = att.masked_fill(mask, float("-inf")).softmax(-1)
        o = torch.einsum("hts,shd->thd", att, vv).reshape(T, m.H * m.hd)
        x = x + m.wo(o)
        n = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + m.eps) * m.ffn_norm
        return x + m.down(F.silu(m.gate(n)) * m.up(n))


def argmax_head(h, head):
    return int((h @ head.T).argmax(-1))


def chain(m, dump, o, n, start, depth, head, ctx=None):
    """Greedy EAGLE chain after known tokens t_0..t_{n-1} of the sequence at offset o, the head's
    context being positions start..n-1 (start >= 1). -> (drafts [depth], logits top-5 per step).
    ctx: (HeadKV, outputs) of a pass over positions start..L-1 of the sequence, to reuse (causal:
    its first n-start rows are the context pass)."""
    if ctx is None:
        kv = HeadKV(m)
        ps = torch.arange(start, n)
        toks = dump.tokens[o + start:o + n]
        feats = dump.hidden[o + start - 1:o + n - 1]
        g = kv.append(dump.embed[toks], feats, ps)[-1]
    else:
        kv = HeadKV(m)
        kv.k, kv.v = ctx[0].k[:n - start], ctx[0].v[:n - start]
        g = ctx[1][n - start - 1]
    drafts, tops = [], []
    for j in range(depth):
        logits = g @ head.T
        d = int(logits.argmax())
        v, i = logits.topk(5)
        drafts.append(d)
        tops.append((i.tolist(), [round(float(x), 4) for x in v]))
        if j + 1 < depth:
            g = kv.append(dump.embed[torch.tensor([d])], g[None], torch.tensor([n + j]))[-1]
    return drafts, tops


def chain_stats(m, dump, seqs, D, head, stride=1, proxy=True, simulate=True):
    """Greedy chains of D drafts of head m (an EagleHead, eval mode) from every stride-th
    continuation position of the sequences `seqs` of `dump`, argmax over `head` [V', d].
    -> {"chains", "depth", "acceptance_by_depth" (unconditional: first j drafts all match, what
    bench-spec reports), "conditional_by_depth", "mean_accepted_per_step"} and, with proxy, the
    trainer's step-1 top-1 / 2-step proxy over the same positions; with simulate, "simulated_run"
    (a greedy speculative run with a chain of D, n advancing by accepted + 1 per step)."""
    full = [0] * (D + 1)  # full[j]: chains whose first j drafts all match
    steps = 0
    sim_full, sim_steps, sim_per_seq = [0] * (D + 1), 0, []
    s1_ok = s1_n = p2_ok = p2_n = 0
    with torch.no_grad():
        for i in seqs:
            s = dump.seqs[i]
            o, L, pl = s["offset"], s["length"], s["prompt_length"]
            ext = dump.extended_tokens(i)  # [L + 1] the greedy stream
            ps = torch.arange(1, L)
            tok = dump.tokens[o + 1:o + L]
            ctx_kv = HeadKV(m)
            ctx_out = ctx_kv.append(dump.embed[tok], dump.hidden[o:o + L - 1], ps)
            if proxy:
                # The trainer's measures over the same positions (teacher-forced step 1; 2-step
                # proxy: every input feature replaced by the head's own 1-step prediction of it).
                pred = m(dump.embed[tok][None], dump.hidden[o:o + L - 1][None], ps[None])[0]  # row q-1: position q
                fi2 = dump.hidden[o:o + L - 1].clone()
                fi2[1:] = pred[:-1]
                pred2 = m(dump.embed[tok][None], fi2[None], ps[None])[0]
            for n in range(max(pl, 2), L - D + 1, stride):
                # Known t_0..t_{n-1}; drafts should equal ext[n .. n+D-1].
                drafts, _ = chain(m, dump, o, n, 1, D, head, (ctx_kv, ctx_out))
                steps += 1
                j = 0
                while j < D and drafts[j] == int(ext[n + j]):
                    j += 1
                for q in range(j + 1):
                    full[q] += 1
                if proxy:
                    # step 1 (teacher-forced) predicts ext[n] from row n-1 (index n-2); the proxy at
                    # row n (index n-1), whose token t_n is the true one, predicts ext[n+1].
                    s1_ok += int(argmax_head(pred[n - 2], head) == int(ext[n]))
                    s1_n += 1
                    p2_ok += int(argmax_head(pred2[n - 1], head) == int(ext[n + 1]))
                    p2_n += 1
            if not simulate:
                continue
            # A speculative run as the engine makes it (greedy, chain of D): after the prefill the
            # first token is known (n = prompt_length + 1); each step drafts, accepts j, then the
            # target's bonus token: n += j + 1.
            n = pl + 1
            seq_sim = {"sequence": i, "steps": 0, "accepted": 0, "accepted_per_pos": [0] * D}
            sim_per_seq.append(seq_sim)
            while n <= L - D + 1:
                drafts, _ = chain(m, dump, o, n, 1, D, head, (ctx_kv, ctx_out))
                j = 0
                while j < D and drafts[j] == int(ext[n + j]):
                    j += 1
                sim_steps += 1
                seq_sim["steps"] += 1
                seq_sim["accepted"] += j
                for q in range(1, j + 1):
                    sim_full[q] += 1
                    seq_sim["accepted_per_pos"][q - 1] += 1
                n += j + 1
    n_chains = max(1, steps)
    res = {"chains": steps, "depth": D,
           "acceptance_by_depth": [round(full[j] / n_chains, 4) for j in range(1, D + 1)],
           "conditional_by_depth": [round(full[j] / max(1, full[j - 1]), 4) for j in range(1, D + 1)],
           "mean_accepted_per_step": round(sum(full[1:]) / n_chains, 4)}
    if proxy:
        res["trainer_top1_step1_same_positions"] = round(s1_ok / max(1, s1_n), 4)
        res["trainer_2step_proxy_same_positions"] = round(p2_ok / max(1, p2_n), 4)
    if simulate:
        res["simulated_run"] = {"steps": sim_steps,
                                "acceptance_by_depth": [round(sim_full[j] / max(1, sim_steps), 4) for j in range(1, D + 1)],
                                "mean_accepted_per_step": round(sum(sim_full[1:]) / max(1, sim_steps), 4),
                                "per_sequence": sim_per_seq}
    return res


def accepted_lengths(ok, b, L, D):
    """ok: [ok_1..ok_D], ok_s [B, T] bool (train_eagle.chain_correct of EagleHead.unrolled's step s:
    row r = position r+1 predicted its greedy next token). -> {n: j} for n = 2..L-D+1: the drafts a
    greedy chain after t_0..t_{n-1} gets accepted (its depth s is step s at position n+s-2)."""
    out = {}
    for n in range(2, L - D + 2):
        j = 0
        while j < D and bool(ok[j][b, n + j - 2]):
            j += 1
        out[n] = j
    return out


def chain_stats_batched(m, dump, seqs, D, head, max_rows=4096):
    """chain_stats (proxy=False, simulate=True) computed batched: one EagleHead.unrolled pass of D
    steps per batch of whole sequences instead of one chain at a time. Equal to chain_stats up to
    float summation order (near-ties); see train_eagle.EagleHead.unrolled for why."""
    from train_eagle import Batches, chain_correct  # noqa: E402  (train_eagle imports this module lazily)
    full = [0] * (D + 1)
    sim_full, sim_steps, sim_per_seq = [0] * (D + 1), 0, []
    data = Batches(dump, seqs, max_rows)
    per = {}
    with torch.no_grad():
        for ids in data.batches():
            tok, fi, fo, lab, pos, mask = data.tensors(ids)
            outs = m.unrolled(dump.embed[tok], fi, pos, D)
            ok = chain_correct(outs, lab, head)
            for b, i in enumerate(ids):
                per[i] = accepted_lengths(ok, b, dump.seqs[i]["length"], D)
    for i in seqs:
        s = dump.seqs[i]
        L, pl = s["length"], s["prompt_length"]
        acc = per[i]
        for n in range(max(pl, 2), L - D + 1):
            for q in range(acc[n] + 1):
                full[q] += 1
        n = pl + 1
        seq_sim = {"sequence": i, "steps": 0, "accepted": 0, "accepted_per_pos": [0] * D}
        sim_per_seq.append(seq_sim)
        while n <= L - D + 1:
            j = acc[n] if n in acc else 0
            sim_steps += 1
            seq_sim["steps"] += 1
            seq_sim["accepted"] += j
            for q in range(1, j + 1):
                sim_full[q] += 1
                seq_sim["accepted_per_pos"][q - 1] += 1
            n += j + 1
    n_chains = max(1, full[0])
    return {"chains": full[0], "depth": D,
            "acceptance_by_depth": [round(full[j] / n_chains, 4) for j in range(1, D + 1)],
            "conditional_by_depth": [round(full[j] / max(1, full[j - 1]), 4) for j in range(1, D + 1)],
            "mean_accepted_per_step": round(sum(full[1:]) / n_chains, 4),
            "simulated_run": {"steps": sim_steps,
                              "acceptance_by_depth": [round(sim_full[j] / max(1, sim_steps), 4) for j in range(1, D + 1)],
                              "mean_accepted_per_step": round(sum(sim_full[1:]) / max(1, sim_steps), 4),
                              "per_sequence": sim_per_seq}}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--dump", required=True, nargs="+")
    ap.add_argument("--eagle", required=True)
    ap.add_argument("--depth", type=int, default=4)
    ap.add_argument("--draft-vocab", type=int, default=0, help="argmax over the first N token ids only (0: all)")
    ap.add_argument("--stride", type=int, default=1, help="every stride-th continuation position starts a chain")
    ap.add_argument("--all-sequences", action="store_true", help="every sequence of the dump, not only the held-out split")
    ap.add_argument("--out", default="")
    ap.add_argument("--cases", type=int, default=0)
    ap.add_argument("--window", type=int, default=6)
    ap.add_argument("--cases-out", default="")
    ap.add_argument("--cases-only", action="store_true", help="write the cases, skip the statistics")
    ap.add_argument("--min-margin", type=float, default=0.05, help="cases: top-1 minus top-2 logit at every step at least this")
    ap.add_argument("--batched", action="store_true",
                    help="statistics from one unrolled pass per batch (chain_stats_batched; no trainer proxy columns)")
    ap.add_argument("--command", default="")
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    dump = common.Dump(a.dump)
    m = load_head(a.eagle, dump)
    head = dump.head if a.draft_vocab <= 0 else dump.head[:a.draft_vocab]
    _, va = dump.split()
    seqs = list(range(len(dump.seqs))) if a.all_sequences else va
    D = a.depth
    res = {"sequences": len(seqs), "draft_vocab": a.draft_vocab or dump.vocab}
    if not a.cases_only:
        if a.batched:
            res.update(chain_stats_batched(m, dump, seqs, D, head))
        else:
            res.update(chain_stats(m, dump, seqs, D, head, a.stride))
    res["command"] = a.command
    if not a.cases_only:
        print(json.dumps(res, indent=1))
    if a.out and not a.cases_only:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)
    if a.cases > 0:
        cases = []
        W = a.window
        with torch.no_grad():
            for i in seqs:
                s = dump.seqs[i]
                o, L, pl = s["offset"], s["length"], s["prompt_length"]
                n = pl + 4
                if n - W < 1 or n + D > L or len(cases) >= a.cases:
                    continue
                start = n - W
                drafts, tops = chain(m, dump, o, n, start, D, head)
                if min(t[1][0] - t[1][1] for t in tops) < a.min_margin:
                    continue  # a near-tie: float32 sums in another order may pick the other token
                ext = dump.extended_tokens(i)
                cases.append({"sequence": i, "tokens": dump.tokens[o:o + n].tolist(),
                              "hidden_begin": start - 1,
                              "features": [[float(x) for x in f] for f in dump.hidden[o + start - 1:o + n - 1].tolist()],
                              "chain": drafts, "top5": [t[0] for t in tops], "top5_logits": [t[1] for t in tops],
                              "target_greedy": ext[n:n + D].tolist()})
        ref = {"format": "specserve-eagle-chain-reference/1",
               "description": "Greedy EAGLE chains of the exported head computed in PyTorch (its own features fed back, its "
                              "own KV), head context = positions hidden_begin+1 .. len(tokens)-1 with the target features "
                              "of positions hidden_begin .. len(tokens)-2 (features rows).",
               "command": a.command, "target_fingerprint": dump.fingerprint,
               "eagle_file": os.path.basename(a.eagle), "eagle_sha256": common.sha256(a.eagle),
               "depth": D, "draft_vocab": a.draft_vocab or dump.vocab, "cases": cases}
        with open(a.cases_out, "w") as f:
            json.dump(ref, f)
        print(f"[chain-reference] wrote {a.cases_out}: {len(cases)} cases")


if __name__ == "__main__":
    main()
