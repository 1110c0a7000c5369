"""Keyword spotting on synthetic log-mel clips, DDP on ranks spawned by the script.

A frozen conv front-end ("pretrained"), a trainable GRU-free conv classifier,
bf16 autocast for the forward, a DataLoader with a worker process. Each rank
sees 7 micro-batches per epoch; with K = 3 the windows are 3, 3 and 1, and each
micro-batch loss is divided by the size of the window it belongs to.
"""
import hashlib
import math
import os
from contextlib import nullcontext

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

WORLD = 2
PORT = 49109
N_MELS, FRAMES, N_WORDS = 16, 24, 6
MICRO_BS = 4
ACCUM = 3
EPOCHS = 2
CLIPS = 2 * 7 * MICRO_BS  # 7 micro-batches per rank per epoch


class SyntheticKWS(Dataset):
    def __init__(self, n):
        g = torch.Generator().manual_seed(2024)
        self.templates = torch.randn(N_WORDS, N_MELS, FRAMES, generator=g)
        self.labels = torch.randint(0, N_WORDS, (n,), generator=g)
        self.noise = torch.randn(n, N_MELS, FRAMES, generator=g)

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, idx):
        y = self.labels[idx]
        shift = int(idx % 3)
        x = torch.roll(self.templates[y], shifts=shift, dims=1) + 0.8 * self.noise[idx]
        return x, y


class KWSNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.frontend = nn.Sequential(nn.Conv1d(N_MELS, 32, 5, padding=2), nn.ReLU())
        self.body = nn.Sequential(
            nn.Conv1d(32, 32, 3, padding=1, groups=4), nn.ReLU(),
            nn.Conv1d(32, 48, 3, stride=2, padding=1), nn.ReLU(),
        )
        self.classifier = nn.Linear(48, N_WORDS)

    def forward(self, x):
        h = self.body(self.frontend(x))
        return self.classifier(h.mean(-1))


def window_sizes(n_micro, k):
    return [min(k, n_micro - s) for s in range(0, n_micro, k)]


def run(rank):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(PORT)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    torch.manual_seed(0)
    net = KWSNet()
    for p in net.frontend.parameters():
        p.requires_grad_(False)
    model = DDP(net)
    opt = torch.optim.AdamW([p for p in net.parameters() if p.requires_grad], lr=4e-3, weight_decay=0.05)

    ds = SyntheticKWS(CLIPS)
    sampler = DistributedSampler(ds, num_replicas=WORLD, rank=rank, shuffle=True, seed=9)
    loader = DataLoader(ds, batch_size=MICRO_BS, sampler=sampler, num_workers=1,
                        persistent_workers=True, multiprocessing_context="spawn")
    n_micro = len(loader)
    sizes = window_sizes(n_micro, ACCUM)
    total_updates = len(sizes) * EPOCHS
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: 0.5 * (1 + math.cos(math.pi * s / total_updates)))

    updates = 0
    for epoch in range(EPOCHS):
        sampler.set_epoch(epoch)
        for idx, (x, y) in enumerate(loader):
            w = idx // ACCUM
            boundary = (idx + 1) % ACCUM == 0 or idx + 1 == n_micro
            with (nullcontext() if boundary else model.no_sync()):
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    logits = model(x)
                loss = F.cross_entropy(logits.float(), y) / sizes[w]
                loss.backward()
            if boundary:
                opt.step()
                sched.step()
                opt.zero_grad(set_to_none=True)
                updates += 1
        if rank == 0:
            print(f"epoch {epoch}: {updates} updates, last loss {loss.item() * sizes[w]:.4f}")

    h = hashlib.sha256()
    for _, p in net.named_parameters():
        h.update(p.detach().float().contiguous().numpy().tobytes())
    if rank == 0:
        print(f"FINAL_SHA256 {h.hexdigest()}")
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(run, nprocs=WORLD, join=True)
