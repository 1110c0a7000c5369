"""DDP trainer class with a frozen projection, gradient_as_bucket_view, a LambdaLR warm-up,
K = 2 under no_sync, stopped after 5 optimizer steps and resumed into freshly built
objects from the checkpoint (model, optimizer, scheduler, data position)."""
import hashlib
import os
import tempfile

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

SEED, K, MB, TOTAL_STEPS, STOP_AT = 11, 2, 5, 12, 5


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(16, 32)
        self.proj.requires_grad_(False)
        self.body = nn.Sequential(nn.Tanh(), nn.Linear(32, 32), nn.Tanh())
        self.out = nn.Linear(32, 3)

    def forward(self, x):
        return self.out(self.body(self.proj(x)))


def dataset(rank, world):
    g = torch.Generator().manual_seed(SEED + 1)
    n = TOTAL_STEPS * K * MB * world
    x = torch.randn(n, 16, generator=g)
    y = (x[:, 0] > 0).long() + (x[:, 1] > 0.5).long()
    return x[rank::world], y[rank::world]


class Trainer:
    def __init__(self, rank, world):
        self.rank, self.world = rank, world
        torch.manual_seed(SEED)
        self.model = DDP(Net(), gradient_as_bucket_view=True)
        params = [p for p in self.model.parameters() if p.requires_grad]
        self.opt = torch.optim.AdamW(params, lr=5e-3)
        self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, lambda s: min(1.0, (s + 1) / 4))
        self.x, self.y = dataset(rank, world)
        self.step = 0

    def state(self):
        return {"model": self.model.module.state_dict(), "opt": self.opt.state_dict(),
                "sched": self.sched.state_dict(), "step": self.step}

    def load(self, st):
        self.model.module.load_state_dict(st["model"])
        self.opt.load_state_dict(st["opt"])
        self.sched.load_state_dict(st["sched"])
        self.step = st["step"]

    def optimizer_step(self):
        base = self.step * K * MB
        for j in range(K):
            sl = slice(base + j * MB, base + (j + 1) * MB)
            ctx = self.model.no_sync() if j < K - 1 else torch.enable_grad()
            with ctx:
                loss = F.cross_entropy(self.model(self.x[sl]), self.y[sl]) / K
                loss.backward()
        self.opt.step()
        self.sched.step()
        self.opt.zero_grad(set_to_none=False)
        self.step += 1

    def run(self, until):
        while self.step < until:
            self.optimizer_step()


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    ckpt_dir = tempfile.mkdtemp(prefix="a_c03_") if rank == 0 else None
    box = [ckpt_dir]
    dist.broadcast_object_list(box, src=0)
    path = os.path.join(box[0], "ckpt.pt")

    t = Trainer(rank, world)
    t.run(STOP_AT)
    if rank == 0:
        torch.save(t.state(), path)
    dist.barrier()
    del t

    t2 = Trainer(rank, world)
    t2.load(torch.load(path, weights_only=False))
    t2.run(TOTAL_STEPS)

    h = hashlib.sha256()
    for _, p in t2.model.module.named_parameters():
        h.update(p.detach().float().contiguous().numpy().tobytes())
    if rank == 0:
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
    dist.barrier()
    if rank == 0:
        os.remove(path)
        os.rmdir(box[0])
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
