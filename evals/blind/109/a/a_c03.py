"""Fabric next-token model over ragged sequences, preempted and resumed mid-run.

Encoder (embedding + GRU) and LM head are set up as separate Fabric modules with their own
optimizers (AdamW / SGD). A window is K micro-batches of padded sequences with different
lengths; its loss is the token-level cross-entropy summed over the window and divided by the
window's token count over all ranks (times W to undo DDP's mean). The run stops halfway,
saves a checkpoint at a window boundary, and continues from fresh objects loaded from it.
The stream ends in a shorter window.
"""
import hashlib
import os
import shutil
import tempfile

import torch
import torch.nn as nn
import torch.nn.functional as F
from lightning_fabric import Fabric

VOCAB, DIM, K = 32, 24, 3
N_MICRO = 35            # per rank: 11 full windows + one window of 2
STOP_AFTER_WINDOWS = 6


class Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, DIM)
        self.rnn = nn.GRU(DIM, DIM, batch_first=True)

    def forward(self, x):
        return self.rnn(self.emb(x))[0]


def micro_batch(rank, i):
    g = torch.Generator().manual_seed(1000 * rank + i)
    bs = 3 + (i + rank) % 3
    lengths = torch.randint(3, 11, (bs,), generator=g)
    T = int(lengths.max())
    seq = torch.randint(0, VOCAB, (bs, T + 1), generator=g)
    seq[:, 1:] = (seq[:, :-1] * 5 + 3) % VOCAB  # a learnable rule
    x, y = seq[:, :-1].clone(), seq[:, 1:].clone()
    pad = torch.arange(T)[None, :] >= lengths[:, None]
    y[pad] = -100
    return x, y


def windows(rank, start_window):
    starts = list(range(0, N_MICRO, K))
    for w, s in enumerate(starts):
        if w < start_window:
            continue
        yield w, [micro_batch(rank, i) for i in range(s, min(s + K, N_MICRO))]


def build(fabric):
    enc, head = Encoder(), nn.Linear(DIM, VOCAB)
    opt_enc = torch.optim.AdamW(enc.parameters(), lr=4e-3, weight_decay=0.0)
    opt_head = torch.optim.SGD(head.parameters(), lr=0.3, momentum=0.8)
    enc, opt_enc = fabric.setup(enc, opt_enc)
    head, opt_head = fabric.setup(head, opt_head)
    return enc, head, opt_enc, opt_head


def train(fabric, enc, head, opt_enc, opt_head, start_window, stop_window):
    W = fabric.world_size
    for w, window in windows(fabric.global_rank, start_window):
        if w >= stop_window:
            return w
        n_local = sum(int((y != -100).sum()) for _, y in window)
        n_total = fabric.all_reduce(torch.tensor(float(n_local)), reduce_op="sum").item()
        for j, (x, y) in enumerate(window):
            last = j == len(window) - 1
            with fabric.no_backward_sync(enc, enabled=not last), fabric.no_backward_sync(head, enabled=not last):
                logits = head(enc(x))
                loss = F.cross_entropy(logits.reshape(-1, VOCAB), y.reshape(-1), ignore_index=-100, reduction="sum")
                fabric.backward(loss * W / n_total)
        fabric.clip_gradients(enc, opt_enc, max_norm=1.0)
        fabric.clip_gradients(head, opt_head, max_norm=1.0)
        opt_enc.step()
        opt_head.step()
        opt_enc.zero_grad()
        opt_head.zero_grad()
    return None


def main():
    fabric = Fabric(accelerator="cpu", devices=2, strategy="ddp")
    fabric.launch()
    fabric.seed_everything(8)

    ckpt_dir = fabric.broadcast(tempfile.mkdtemp(prefix="a_c03_") if fabric.global_rank == 0 else None, src=0)
    ckpt = os.path.join(ckpt_dir, "state.ckpt")

    # first leg: train, then "preempt" at a window boundary
    enc, head, opt_enc, opt_head = build(fabric)
    stopped_at = train(fabric, enc, head, opt_enc, opt_head, 0, STOP_AFTER_WINDOWS)
    fabric.save(ckpt, {"enc": enc, "head": head, "opt_enc": opt_enc, "opt_head": opt_head, "window": stopped_at})
    fabric.barrier()
    del enc, head, opt_enc, opt_head

    # second leg: fresh objects (different init seed), everything restored from the checkpoint
    fabric.seed_everything(1234)
    enc, head, opt_enc, opt_head = build(fabric)
    state = {"enc": enc, "head": head, "opt_enc": opt_enc, "opt_head": opt_head, "window": 0}
    fabric.load(ckpt, state)
    train(fabric, enc, head, opt_enc, opt_head, state["window"], 10 ** 9)

    fabric.barrier()
    if fabric.global_rank == 0:
        shutil.rmtree(ckpt_dir, ignore_errors=True)
        h = hashlib.sha256()
        for mod in (enc, head):
            for _, p in mod.named_parameters():
                h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)


if __name__ == "__main__":
    main()
