"""Frame-level phone classifier (speech) with FSDP2 on 2 spawned ranks.
Utterances have different lengths; the loss is a sum over valid frames divided by
the window's frame count over all ranks (times the world size, since FSDP2
averages gradients over ranks). Each epoch has 7 micro-batches per rank with
K = 3, so windows are 3-3-1. A frozen convolutional front-end, gradient clipping
on DTensors at 0.5 and a linear warm-up schedule."""
import hashlib
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

WORLD = 2
PORT = 49207
K = 3
EPOCHS = 2
MICRO_PER_EPOCH = 7
N_MELS = 12
N_PHONES = 8


class FrontEnd(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv1d(N_MELS, 24, 5, padding=2)

    def forward(self, x):  # x: (B, T, n_mels)
        return F.gelu(self.conv(x.transpose(1, 2)).transpose(1, 2))


class Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.front = FrontEnd()
        self.rnn_in = nn.Linear(24, 32)
        self.layers = nn.ModuleList([nn.Sequential(nn.LayerNorm(32), nn.Linear(32, 32), nn.GELU())
                                     for _ in range(2)])
        self.out = nn.Linear(32, N_PHONES)

    def forward(self, x):
        h = self.rnn_in(self.front(x))
        for layer in self.layers:
            h = h + layer(h)
        return self.out(h)


def make_batches(rank, epoch):
    g = torch.Generator().manual_seed(1000 * epoch + rank)
    batches = []
    for _ in range(MICRO_PER_EPOCH):
        b = int(torch.randint(2, 6, (1,), generator=g))
        lengths = torch.randint(6, 20, (b,), generator=g)
        T = int(lengths.max())
        x = torch.randn(b, T, N_MELS, generator=g)
        y = (x[..., :N_PHONES].argmax(-1) + torch.randint(0, 2, (b, T), generator=g)) % N_PHONES
        mask = torch.arange(T)[None, :] < lengths[:, None]
        y = y.masked_fill(~mask, -100)
        batches.append((x, y))
    return batches


def worker(rank):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(PORT))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    torch.manual_seed(0)
    model = Encoder()
    model.front.requires_grad_(False)
    for layer in model.layers:
        fully_shard(layer)
    fully_shard(model)

    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=3e-3,
                            weight_decay=0.0)
    total_steps = EPOCHS * ((MICRO_PER_EPOCH + K - 1) // K)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 2) * (1 - s / (total_steps + 1)))

    for epoch in range(EPOCHS):
        batches = make_batches(rank, epoch)
        for start in range(0, len(batches), K):
            window = batches[start:start + K]
            n_frames = torch.tensor(float(sum(int((y != -100).sum()) for _, y in window)))
            dist.all_reduce(n_frames)
            for j, (x, y) in enumerate(window):
                model.set_requires_gradient_sync(j == len(window) - 1)
                logits = model(x)
                loss = F.cross_entropy(logits.reshape(-1, N_PHONES), y.reshape(-1),
                                       ignore_index=-100, reduction="sum")
                (loss * WORLD / n_frames).backward()
            torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], 0.5)
            opt.step()
            sched.step()
            opt.zero_grad()

    h = hashlib.sha256()
    for _, p in model.named_parameters():
        t = p.full_tensor() if isinstance(p, DTensor) else p
        h.update(t.detach().float().contiguous().numpy().tobytes())
    if rank == 0:
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(worker, nprocs=WORLD, join=True)
