"""Token-level knowledge distillation (teacher -> student) on 2 DDP ranks, torchrun.

Sequences have different lengths; the objective of one optimizer step is the
mean over every non-pad token of the window on all ranks, so each micro-batch
sums its token losses and the window's global token count (times the world size,
DDP averages) normalises them.  10 micro-batches per epoch with K = 4 leaves a
short last window of 2 that is normalised by its own count.  The student's
embedding is frozen (shared with the teacher's vocabulary).
"""
import hashlib
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

PAD = 0
V, T_MAX = 40, 14
ACCUM, MICRO_BS, EPOCHS = 4, 6, 3
TEMP, ALPHA = 2.0, 0.5


class LM(nn.Module):
    def __init__(self, d, layers):
        super().__init__()
        self.emb = nn.Embedding(V, d, padding_idx=PAD)
        self.rnn = nn.LSTM(d, d, num_layers=layers, batch_first=True)
        self.out = nn.Linear(d, V)

    def forward(self, x):
        return self.out(self.rnn(self.emb(x))[0])


def make_epoch(rank, epoch, n_micro=10):
    g = torch.Generator().manual_seed(10_000 * epoch + rank)
    out = []
    for _ in range(n_micro):
        lens = torch.randint(3, T_MAX + 1, (MICRO_BS,), generator=g)
        x = torch.randint(1, V, (MICRO_BS, T_MAX + 1), generator=g)
        ar = torch.arange(T_MAX + 1)
        x[ar[None, :] >= lens[:, None] + 1] = PAD
        out.append((x[:, :-1], x[:, 1:]))
    return out


def window_loss_sum(student, teacher, x, y):
    mask = y != PAD
    s = student(x)
    with torch.no_grad():
        t = teacher(x)
    kd = F.kl_div(F.log_softmax(s / TEMP, -1), F.log_softmax(t / TEMP, -1), log_target=True,
                  reduction="none").sum(-1) * TEMP ** 2
    ce = F.cross_entropy(s.transpose(1, 2), y, ignore_index=PAD, reduction="none")
    return ((ALPHA * kd + (1 - ALPHA) * ce) * mask).sum(), mask.sum()


def main():
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    teacher = LM(64, 2).eval()
    for p in teacher.parameters():
        p.requires_grad_(False)
    torch.manual_seed(1)
    base = LM(32, 1)
    base.emb.weight.requires_grad_(False)
    student = DDP(base)
    opt = torch.optim.AdamW([p for p in base.parameters() if p.requires_grad], lr=2e-3, weight_decay=0.05)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=4, gamma=0.7)

    for epoch in range(EPOCHS):
        batches = make_epoch(rank, epoch)
        for w0 in range(0, len(batches), ACCUM):
            window = batches[w0:w0 + ACCUM]
            n = torch.stack([(y != PAD).sum() for _, y in window]).sum().float()
            dist.all_reduce(n)
            for i, (x, y) in enumerate(window):
                student.require_backward_grad_sync = i == len(window) - 1
                loss_sum, _ = window_loss_sum(student, teacher, x, y)
                (loss_sum * world / n).backward()
            torch.nn.utils.clip_grad_norm_(base.parameters(), 0.5)
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)

    if rank == 0:
        h = hashlib.sha256()
        for _, p in base.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        print("FINAL_SHA256", h.hexdigest(), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
