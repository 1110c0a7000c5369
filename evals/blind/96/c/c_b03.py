"""Frame-level knowledge distillation for an acoustic model (teacher posteriors -> student).

Utterances are bucketed into micro-batches by a frame budget (dynamic batching), so every
micro-batch holds a different number of valid frames.  2 DDP ranks, gloo, torchrun.
The objective is the KL(teacher || student) averaged over all valid frames of the update.
"""
import hashlib
import math
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

FEAT, N_UNITS = 20, 32
FRAME_BUDGET = 160
GRAD_ACCUM = 4
MAX_UPDATES = 14
TEMPERATURE = 2.0
LR = 1e-3
SEED = 2024


class Encoder(nn.Module):
    def __init__(self, hidden):
        super().__init__()
        self.conv = nn.Conv1d(FEAT, hidden, kernel_size=3, padding=1)
        self.ff = nn.Sequential(nn.GELU(), nn.Linear(hidden, hidden), nn.GELU())
        self.out = nn.Linear(hidden, N_UNITS)

    def forward(self, feats):  # (B, T, FEAT)
        h = self.conv(feats.transpose(1, 2)).transpose(1, 2)
        return self.out(self.ff(h))


def make_corpus(rank, n_utts=160):
    g = torch.Generator().manual_seed(SEED + 17 * rank)
    lens = torch.randint(6, 60, (n_utts,), generator=g).tolist()
    return [torch.randn(L, FEAT, generator=g) for L in lens]


def bucket_by_frames(utts, budget):
    """Greedy dynamic batching: fill a micro-batch until padded frames exceed the budget."""
    order = sorted(range(len(utts)), key=lambda i: utts[i].size(0))
    batches, cur, cur_max = [], [], 0
    for i in order:
        L = utts[i].size(0)
        if cur and max(cur_max, L) * (len(cur) + 1) > budget:
            batches.append(cur)
            cur, cur_max = [], 0
        cur.append(i)
        cur_max = max(cur_max, L)
    if cur:
        batches.append(cur)
    g = torch.Generator().manual_seed(SEED)
    perm = torch.randperm(len(batches), generator=g).tolist()
    return [batches[j] for j in perm]


def collate(utts, idx):
    lens = torch.tensor([utts[i].size(0) for i in idx])
    T = int(lens.max())
    feats = torch.zeros(len(idx), T, FEAT)
    for b, i in enumerate(idx):
        feats[b, : lens[b]] = utts[i]
    mask = torch.arange(T)[None, :] < lens[:, None]
    return feats, mask


def distill_loss(student_logits, teacher_logits, mask, window_frames, world):
    s = F.log_softmax(student_logits[mask] / TEMPERATURE, dim=-1)
    t = F.log_softmax(teacher_logits[mask] / TEMPERATURE, dim=-1)
    kd = F.kl_div(s, t, log_target=True, reduction="batchmean")
    return kd * TEMPERATURE ** 2 / GRAD_ACCUM


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(SEED)
    teacher = Encoder(128).eval().requires_grad_(False)
    student = DDP(Encoder(48))
    opt = torch.optim.AdamW(student.parameters(), lr=LR, weight_decay=0.01)

    utts = make_corpus(rank)
    batches = bucket_by_frames(utts, FRAME_BUDGET)
    n_windows = torch.tensor(min(MAX_UPDATES, len(batches) // GRAD_ACCUM))
    dist.all_reduce(n_windows, op=dist.ReduceOp.MIN)
    n_windows = int(n_windows)
    t0, frames_seen = time.time(), 0
    for update in range(n_windows):
        window = [collate(utts, idx) for idx in batches[update * GRAD_ACCUM:(update + 1) * GRAD_ACCUM]]
        window_frames = torch.tensor(float(sum(int(m.sum()) for _, m in window)))
        dist.all_reduce(window_frames)
        frames_seen += int(window_frames)
        for k, (feats, mask) in enumerate(window):
            sync = k == GRAD_ACCUM - 1
            with (student.no_sync() if not sync else torch.enable_grad()):
                with torch.no_grad():
                    t_logits = teacher(feats)
                loss = distill_loss(student(feats), t_logits, mask, window_frames, world)
                loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if rank == 0 and update % 4 == 0:
            print(f"update {update} kd {loss.item():.4f} frames/s {frames_seen / (time.time() - t0):.0f}",
                  flush=True)

    h = hashlib.sha256()
    for _, p in student.module.named_parameters():
        h.update(p.detach().float().contiguous().numpy().tobytes())
    if rank == 0:
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
