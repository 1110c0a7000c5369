"""Multi-task trainer (classification + regression) on 2 spawned DDP ranks.

The loop is split over hooks: on_window_start / on_micro_batch / on_window_end.
Micro-batches have uneven sizes; an epoch is 7 micro-batches per rank with K = 3,
so windows are 3, 3, 1. The objective of a window is the per-sample loss summed over
the window on all ranks, divided by that all-ranks sample count (times W, because
DDP averages). Trunk on AdamW, heads on SGD with momentum, an EMA copy of the model,
and the run is interrupted after epoch 0 and resumed into freshly built objects.
"""
import copy
import hashlib
import os
import shutil
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

WORLD = 2
PORT = 49221
K = 3
MICRO_PER_EPOCH = 7
EPOCHS = 3
IN_DIM, N_CLS = 16, 5
SEED = 11


class MultiTaskNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.trunk = nn.Sequential(nn.Linear(IN_DIM, 48), nn.Tanh(), nn.Linear(48, 48), nn.Tanh())
        self.cls_head = nn.Linear(48, N_CLS)
        self.reg_head = nn.Linear(48, 1)

    def forward(self, x):
        h = self.trunk(x)
        return self.cls_head(h), self.reg_head(h).squeeze(-1)


def micro_batch(epoch, rank, idx):
    g = torch.Generator().manual_seed(SEED * 7919 + epoch * 101 + rank * 13 + idx)
    n = int(torch.randint(2, 8, (1,), generator=g))
    x = torch.randn(n, IN_DIM, generator=g)
    y_cls = (x[:, :N_CLS] * 2).argmax(-1)
    y_reg = x.sum(-1) * 0.3 + 0.1 * torch.randn(n, generator=g)
    return x, y_cls, y_reg


class Trainer:
    def __init__(self, rank):
        self.rank = rank
        torch.manual_seed(SEED)
        self.model = MultiTaskNet()
        self.ddp = DDP(self.model)
        self.opt_trunk = torch.optim.AdamW(self.model.trunk.parameters(), lr=3e-3, weight_decay=0.05)
        self.opt_heads = torch.optim.SGD(
            list(self.model.cls_head.parameters()) + list(self.model.reg_head.parameters()),
            lr=0.05, momentum=0.9)
        self.ema = copy.deepcopy(self.model).requires_grad_(False)
        self.ema_decay = 0.9
        self.epoch = 0
        self.updates = 0

    # ---- checkpointing -------------------------------------------------------
    def state_dict(self):
        return {"model": self.model.state_dict(), "ema": self.ema.state_dict(),
                "opt_trunk": self.opt_trunk.state_dict(), "opt_heads": self.opt_heads.state_dict(),
                "epoch": self.epoch, "updates": self.updates}

    def load_state_dict(self, sd):
        self.model.load_state_dict(sd["model"])
        self.ema.load_state_dict(sd["ema"])
        self.opt_trunk.load_state_dict(sd["opt_trunk"])
        self.opt_heads.load_state_dict(sd["opt_heads"])
        self.epoch, self.updates = sd["epoch"], sd["updates"]

    # ---- hooks ---------------------------------------------------------------
    def on_window_start(self, window):
        n = torch.tensor(float(sum(b[0].shape[0] for b in window)))
        dist.all_reduce(n)
        self.window_count = n

    def on_micro_batch(self, batch, is_last):
        x, y_cls, y_reg = batch
        self.ddp.require_backward_grad_sync = is_last
        logits, pred = self.ddp(x)
        per_sample = F.cross_entropy(logits, y_cls, reduction="none") + \
            0.5 * (pred - y_reg) ** 2
        loss = per_sample.sum() * WORLD / self.window_count
        loss.backward()
        return loss.detach()

    def on_window_end(self):
        for opt in (self.opt_trunk, self.opt_heads):
            opt.step()
        for opt in (self.opt_trunk, self.opt_heads):
            opt.zero_grad(set_to_none=True)
        with torch.no_grad():
            for pe, p in zip(self.ema.parameters(), self.model.parameters()):
                pe.lerp_(p, 1 - self.ema_decay)
        self.updates += 1

    # ---- loop ----------------------------------------------------------------
    def train_epoch(self):
        batches = [micro_batch(self.epoch, self.rank, i) for i in range(MICRO_PER_EPOCH)]
        for start in range(0, len(batches), K):
            window = batches[start:start + K]
            self.on_window_start(window)
            total = 0.0
            for j, b in enumerate(window):
                total += self.on_micro_batch(b, is_last=(j == len(window) - 1)).item()
            self.on_window_end()
            if self.rank == 0:
                print(f"epoch {self.epoch} update {self.updates} loss {total:.4f}", flush=True)
        self.epoch += 1


def run(rank, ckpt_dir):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(PORT)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    torch.set_num_threads(1)
    path = os.path.join(ckpt_dir, "trainer.pt")

    first = Trainer(rank)
    first.train_epoch()
    if rank == 0:
        torch.save(first.state_dict(), path)
    dist.barrier()
    del first  # "preempted"

    trainer = Trainer(rank)
    trainer.load_state_dict(torch.load(path, weights_only=False))
    while trainer.epoch < EPOCHS:
        trainer.train_epoch()

    if rank == 0:
        flat = torch.cat([p.detach().float().reshape(-1) for _, p in trainer.model.named_parameters()])
        print("FINAL_SHA256", hashlib.sha256(flat.numpy().tobytes()).hexdigest(), flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    ckpt_dir = tempfile.mkdtemp(prefix="c_c01_")
    try:
        mp.spawn(run, args=(ckpt_dir,), nprocs=WORLD, join=True)
    finally:
        shutil.rmtree(ckpt_dir, ignore_errors=True)
