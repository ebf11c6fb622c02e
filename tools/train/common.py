"""Shared pieces of the head trainers (train_medusa.py, train_eagle.py).

Reads a `specserve dump-hidden` directory (tools/cli/dump_hidden_lib.h):
  hidden.npy [N, d] float16 final-norm hidden states; tokens.npy [N] int32; argmax.npy [N] int32
  (the target's greedy next token at each position); head.npy / embed.npy [V, d] float32
  (dequantized output head / token embedding of the target); index.json (sequences, config,
  target_fingerprint).
Also: the restricted-vocabulary cross-entropy, the train/validation split, curve recording
(JSON + PNG), the SHA-256 of files, and the GGUF writer shared by both exporters.
"""
import hashlib
import json
import math
import os
import time

import numpy as np
import torch

IGNORE = -100  # label of positions without a target (cross_entropy's ignore_index)


class Dump:
    """One or more dump-hidden directories of the same target, concatenated in order (hidden as
    float32 torch tensors; ~100 MB per 45k rows). Several directories of consecutive prompt
    ranges equal one dump of all the prompts (greedy output does not depend on the batch)."""

    def __init__(self, paths):
        paths = [paths] if isinstance(paths, str) else list(paths)
        self.path = paths[0]
        hid, tok, arg, self.seqs = [], [], [], []
        base = 0
        for p in paths:
            with open(os.path.join(p, "index.json")) as f:
                index = json.load(f)
            if p == paths[0]:
                self.index = index
            elif index["target_fingerprint"] != self.index["target_fingerprint"]:
                raise ValueError(f"{p}: dump of another target ({index['target_fingerprint']})")
            hid.append(np.load(os.path.join(p, "hidden.npy")))  # [N_i, d] float16
            tok.append(np.load(os.path.join(p, "tokens.npy")))  # [N_i] int32
            arg.append(np.load(os.path.join(p, "argmax.npy")))  # [N_i] int32
            for s in index["sequences"]:
                self.seqs.append(dict(s, offset=s["offset"] + base))
            base += len(tok[-1])
        self.hidden = torch.from_numpy(np.concatenate(hid).astype(np.float32))  # [N, d]
        self.tokens = torch.from_numpy(np.concatenate(tok).astype(np.int64))  # [N]
        self.argmax = torch.from_numpy(np.concatenate(arg).astype(np.int64))  # [N]
        # The output head and embedding come from the first dump that has both files (dump-hidden
        # --no-weights writes neither, and removes a previous dump's).
        with_weights = [p for p in paths if os.path.exists(os.path.join(p, "head.npy"))
                        and os.path.exists(os.path.join(p, "embed.npy"))]
        if not with_weights:
            raise ValueError(f"{', '.join(paths)}: no head.npy / embed.npy (dumped with --no-weights): "
                             "run `specserve dump-hidden` once without --no-weights")
        self.head = torch.from_numpy(np.load(os.path.join(with_weights[0], "head.npy")))  # [V, d] float32
        self.embed = torch.from_numpy(np.load(os.path.join(with_weights[0], "embed.npy")))  # [V, d] float32
        self.d = int(self.index["hidden_size"])
        self.vocab = int(self.index["vocab_size"])
        self.fingerprint = self.index["target_fingerprint"]
        self.config = self.index["target_config"]
        assert self.hidden.shape == (len(self.tokens), self.d), (self.hidden.shape, self.d)
        assert self.head.shape == (self.vocab, self.d)

    def split(self, val_fraction=0.08, seed=0):
        """Sequence indices (train, val): a fixed random held-out set of whole sequences."""
        g = np.random.default_rng(seed)
        order = g.permutation(len(self.seqs))
        nval = max(1, int(round(len(order) * val_fraction)))
        return sorted(order[nval:].tolist()), sorted(order[:nval].tolist())

    def extended_tokens(self, i):
        """Tokens of sequence i followed by the target's argmax after its last token (EOS when the
        continuation stopped): the greedy stream the heads are asked to predict. [length + 1]"""
        s = self.seqs[i]
        o, n = s["offset"], s["length"]
        return torch.cat([self.tokens[o:o + n], self.argmax[o + n - 1:o + n]])


class SubVocab:
    """Cross-entropy over the token ids that occur as labels in the data instead of all V.

    NOTE: a full-vocabulary softmax (49,152 x 576 per row, per head) dominates the CPU time of
    training; the restricted softmax normalises over the tokens the data can ask for. Evaluation
    (the reported top-1 accuracies) always uses the full output head."""

    def __init__(self, head, label_ids):
        ids = torch.unique(label_ids[label_ids >= 0])
        self.ids = ids  # [V'] sorted vocabulary ids
        self.remap = torch.full((head.shape[0],), IGNORE, dtype=torch.long)
        self.remap[ids] = torch.arange(len(ids))
        self.head = head[ids].contiguous()  # [V', d]

    def labels(self, y):
        """Full-vocabulary labels (IGNORE kept) -> indices into ids."""
        out = torch.full_like(y, IGNORE)
        m = y >= 0
        out[m] = self.remap[y[m]]
        return out

    def loss(self, h, y):
        """Mean CE of head(h) [.., d] against full-vocab labels y [..] (IGNORE skipped)."""
        logits = h @ self.head.T
        return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), self.labels(y).reshape(-1),
                                                 ignore_index=IGNORE)


def full_top1(h, y, head, chunk=4096):
    """(correct, counted): argmax over the FULL output head of h [n, d] vs labels y [n]."""
    correct = counted = 0
    with torch.no_grad():
        for s in range(0, h.shape[0], chunk):
            hh, yy = h[s:s + chunk], y[s:s + chunk]
            m = yy >= 0
            if m.any():
                pred = (hh[m] @ head.T).argmax(-1)
                correct += int((pred == yy[m]).sum())
                counted += int(m.sum())
    return correct, counted


def cosine_lr(step, total, base, warmup=50):
    if step < warmup:
        return base * (step + 1) / warmup
    return base * 0.5 * (1 + math.cos(math.pi * min(1.0, (step - warmup) / max(1, total - warmup))))


class Curves:
    """Loss / accuracy curves: appended during training, written as JSON and a PNG."""

    def __init__(self, meta):
        self.data = {"meta": meta, "train": [], "val": []}
        self.t0 = time.time()

    def train(self, **kw):
        kw["time_s"] = round(time.time() - self.t0, 2)
        self.data["train"].append(kw)

    def val(self, **kw):
        kw["time_s"] = round(time.time() - self.t0, 2)
        self.data["val"].append(kw)

    def write(self, json_path, png_path, title, loss_keys, acc_keys):
        os.makedirs(os.path.dirname(os.path.abspath(json_path)), exist_ok=True)
        with open(json_path, "w") as f:
            json.dump(self.data, f, indent=1)
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, (a1, a2) = plt.subplots(1, 2, figsize=(12, 4.5))
        tr = self.data["train"]
        for k in loss_keys:
            if tr and k in tr[0]:
                a1.plot([r["epoch"] for r in tr], [r[k] for r in tr], label=f"train {k}", alpha=0.8)
        va = self.data["val"]
        for k in loss_keys:
            rows = [r for r in va if k in r]
            if rows:
                a1.plot([r["epoch"] for r in rows], [r[k] for r in rows], "o-", label=f"val {k}")
        a1.set_xlabel("epoch")
        a1.set_ylabel("loss")
        a1.set_title(f"{title}: loss")
        a1.grid(alpha=0.3)
        a1.legend(fontsize=7)
        for k in acc_keys:
            rows = [r for r in va if k in r]
            if rows:
                a2.plot([r["epoch"] for r in rows], [r[k] for r in rows], "o-", label=k)
        best = self.data["meta"].get("best_epoch")
        if best is not None:
            a2.axvline(best, color="grey", ls="--", lw=1, label=f"exported (epoch {best})")
        a2.set_xlabel("epoch")
        a2.set_ylabel("top-1 accuracy (held-out, full vocabulary)")
        a2.set_ylim(0, 1)
        a2.set_title(f"{title}: top-1 accuracy")
        a2.grid(alpha=0.3)
        a2.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(png_path, dpi=110)
        plt.close(fig)


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for b in iter(lambda: f.read(1 << 20), b""):
            h.update(b)
    return h.hexdigest()


def gguf_writer(path, arch):
    """A gguf.GGUFWriter for `path` with general.architecture = arch (PyPI `gguf`)."""
    import gguf
    return gguf.GGUFWriter(path, arch)


def add_weight(w, name, t):
    """Adds a torch Linear weight [out, in] as F16 (GGUF shape [in, out], llama.cpp's layout)."""
    w.add_tensor(name, t.detach().to(torch.float32).numpy().astype(np.float16))


def add_f32(w, name, t):
    """Adds a bias / norm vector as F32."""
    w.add_tensor(name, t.detach().to(torch.float32).numpy().astype(np.float32))


def finish_gguf(w):
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def setup_threads(n):
    torch.set_num_threads(n)
    torch.manual_seed(0)
