"""Token-level distillation on spawned ranks with a hand-written gradient all-reduce.

A frozen teacher and a student whose token embedding is frozen (copied from the
teacher). Sequences are padded to different lengths, so micro-batches carry
different numbers of valid tokens. A DataLoader with a worker process feeds each
rank; windows of K = 3 micro-batches are read ahead, the KL/CE loss is a token sum
over the window's valid-token count on all ranks, and gradients are summed across
ranks once per window. 14 micro-batches per rank: the last window has 2.
"""
import hashlib
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

V, D, T, BS, K, N_MICRO, TEMP, ALPHA, PORT = 32, 32, 12, 4, 3, 14, 2.0, 0.7, 41208


class SeqData(Dataset):
    def __init__(self, rank):
        g = torch.Generator().manual_seed(500 + rank)
        n = N_MICRO * BS
        self.x = torch.randint(1, V, (n, T), generator=g)
        self.lens = torch.randint(3, T + 1, (n,), generator=g)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        mask = torch.arange(T) < self.lens[i]
        return self.x[i] * mask, mask


class LM(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.embed = nn.Embedding(V, d)
        self.rnn = nn.LSTM(d, d, batch_first=True)
        self.proj = nn.Linear(d, V)

    def forward(self, x):
        return self.proj(self.rnn(self.embed(x))[0])


def windows(loader, k):
    buf = []
    for b in loader:
        buf.append(b)
        if len(buf) == k:
            yield buf
            buf = []
    if buf:
        yield buf


def allreduce_grads(params):
    for p in params:
        if p.grad is not None:
            dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)


def worker(rank, world):
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(PORT)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(0)
    teacher = LM(48).eval().requires_grad_(False)
    student = LM(D)
    with torch.no_grad():
        student.embed.weight.copy_(teacher.embed.weight[:, :D])
    student.embed.weight.requires_grad_(False)
    trainable = [p for p in student.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(trainable, lr=3e-3, weight_decay=0.01)

    loader = DataLoader(SeqData(rank), batch_size=BS, shuffle=False, num_workers=1)
    for epoch in range(2):
        for win in windows(loader, K):
            n_valid = torch.tensor([sum(int(m[:, 1:].sum()) for _, m in win)])
            dist.all_reduce(n_valid)
            for x, m in win:
                inp, tgt, tm = x[:, :-1], x[:, 1:], m[:, 1:].float()
                with torch.no_grad():
                    t_logits = teacher(inp)
                s_logits = student(inp)
                kl = F.kl_div(F.log_softmax(s_logits / TEMP, -1), F.log_softmax(t_logits / TEMP, -1),
                              log_target=True, reduction="none").sum(-1) * TEMP ** 2
                ce = F.cross_entropy(s_logits.transpose(1, 2), tgt, reduction="none")
                loss = ((ALPHA * kl + (1 - ALPHA) * ce) * tm).sum() / n_valid
                loss.backward()
            allreduce_grads(trainable)
            torch.nn.utils.clip_grad_norm_(trainable, 0.5)
            opt.step()
            opt.zero_grad(set_to_none=True)

    if rank == 0:
        h = hashlib.sha256()
        for _, p in student.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(worker, args=(2,), nprocs=2, join=True)
