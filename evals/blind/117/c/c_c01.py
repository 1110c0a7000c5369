"""Sequence-level knowledge distillation with Lightning Fabric (DDP, 2 CPU ranks).

Padded sequences of varying length; each optimizer window is normalised by the number
of real tokens in the whole window on all ranks (counted ahead). Epochs of 8
micro-batches per rank with K = 3 give windows of 3, 3 and 2 micro-batches. Only the
forward runs under no_backward_sync: DDP decides at the forward whether the backward
reduces, so the backward may sit outside the block.
"""
import hashlib
import os

import torch
import torch.nn as nn
import torch.nn.functional as F
from lightning_fabric import Fabric

VOCAB, D, T = 24, 32, 12
K, B, EPOCHS, PER_EPOCH = 3, 4, 2, 8
TAU, ALPHA, MAX_NORM = 2.0, 0.5, 0.5


class Seq(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, d)
        self.rnn = nn.GRU(d, d, batch_first=True)
        self.out = nn.Linear(d, VOCAB)

    def forward(self, x):
        return self.out(self.rnn(self.emb(x))[0])


def data(rank, world):
    g = torch.Generator().manual_seed(99)
    n = world * PER_EPOCH * B
    x = torch.randint(1, VOCAB, (n, T), generator=g)
    lengths = torch.randint(3, T + 1, (n,), generator=g)
    mask = torch.arange(T)[None, :] < lengths[:, None]
    x = x.masked_fill(~mask, 0)
    return x[rank::world], mask[rank::world]


def windows(n, k):
    i = 0
    while i < n:
        yield list(range(i, min(i + k, n)))
        i += k


def sha(model):
    h = hashlib.sha256()
    for _, p in model.named_parameters():
        h.update(p.detach().float().contiguous().cpu().numpy().tobytes())
    return h.hexdigest()


def main():
    fabric = Fabric(accelerator="cpu", devices=2, strategy="ddp")
    fabric.launch()
    fabric.seed_everything(0)
    torch.use_deterministic_algorithms(True)
    W = fabric.world_size

    teacher = Seq(64).eval().requires_grad_(False)
    student = Seq(D)
    opt = torch.optim.AdamW(student.parameters(), lr=5e-3, weight_decay=0.05)
    model, opt = fabric.setup(student, opt)

    x_all, m_all = data(fabric.global_rank, W)
    for epoch in range(EPOCHS):
        perm = torch.randperm(len(x_all), generator=torch.Generator().manual_seed(epoch))
        x_ep, m_ep = x_all[perm], m_all[perm]
        for win in windows(PER_EPOCH, K):
            # real (target) tokens in the whole window, all ranks
            local = sum(int(m_ep[j * B:(j + 1) * B, 1:].sum()) for j in win)
            n_tok = fabric.all_reduce(torch.tensor(float(local)), reduce_op="sum")
            for pos, j in enumerate(win):
                x = x_ep[j * B:(j + 1) * B]
                m = m_ep[j * B:(j + 1) * B, 1:].float()
                with fabric.no_backward_sync(model, enabled=pos < len(win) - 1):
                    s = model(x[:, :-1])
                with torch.no_grad():
                    t = teacher(x[:, :-1])
                kd = F.kl_div(F.log_softmax(s / TAU, -1), F.log_softmax(t / TAU, -1),
                              log_target=True, reduction="none").sum(-1) * TAU * TAU
                ce = F.cross_entropy(s.transpose(1, 2), x[:, 1:], reduction="none")
                tok_loss = ALPHA * kd + (1 - ALPHA) * ce
                loss = (tok_loss * m).sum() * W / n_tok
                fabric.backward(loss)
            fabric.clip_gradients(model, opt, max_norm=MAX_NORM)
            opt.step()
            opt.zero_grad()

    if fabric.global_rank == 0:
        print(f"FINAL_SHA256 {sha(student)}", flush=True)
    fabric.barrier()


if __name__ == "__main__":
    main()
