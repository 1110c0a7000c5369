# DDP classifier trainer with a plateau scheduler driven by the (all-ranks) training loss.
import hashlib, os
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

HPARAMS = dict(in_dim=20, hidden=48, classes=5, micro_bs=8, accum=3, updates=24,
               lr=0.02, plateau_patience=1, plateau_factor=0.5)


class Net(nn.Module):
    def __init__(self, h):
        super().__init__()
        self.f = nn.Sequential(nn.Linear(h["in_dim"], h["hidden"]), nn.ReLU(),
                               nn.Linear(h["hidden"], h["hidden"]), nn.ReLU(),
                               nn.Linear(h["hidden"], h["classes"]))

    def forward(self, x):
        return self.f(x)


class DDPTrainer:
    def __init__(self, h):
        self.h = h
        dist.init_process_group("gloo")
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        torch.manual_seed(0)
        self.model = DDP(Net(h))
        self.opt = torch.optim.SGD(self.model.parameters(), lr=h["lr"], momentum=0.9)
        self.sched = torch.optim.lr_scheduler.ReduceLROnPlateau(
            self.opt, mode="min", factor=h["plateau_factor"], patience=h["plateau_patience"], threshold=1e-3)
        g = torch.Generator().manual_seed(7)
        self.proj = torch.randn(h["in_dim"], h["classes"], generator=g)
        self.gen = torch.Generator().manual_seed(50 + self.rank)
        self.window_loss = 0.0

    def batch(self):
        x = torch.randn(self.h["micro_bs"], self.h["in_dim"], generator=self.gen)
        y = (x @ self.proj + 0.8 * torch.randn(x.size(0), self.h["classes"], generator=self.gen)).argmax(-1)
        return x, y

    def global_mean(self, v):
        t = torch.tensor([v], dtype=torch.float64)
        dist.all_reduce(t)
        return (t / self.world).item()

    def micro_step(self, k, K):
        x, y = self.batch()
        ctx = self.model.no_sync() if k < K - 1 else torch.enable_grad()
        with ctx:
            loss = F.cross_entropy(self.model(x), y) / K
            loss.backward()
        self.on_micro_end(loss.item())

    def on_micro_end(self, loss_val):
        self.window_loss += loss_val

    def on_update_end(self):
        self.sched.step(self.global_mean(self.window_loss))
        self.window_loss = 0.0

    def fit(self):
        K = self.h["accum"]
        for u in range(self.h["updates"]):
            for k in range(K):
                self.micro_step(k, K)
            self.opt.step()
            self.opt.zero_grad(set_to_none=True)
            self.on_update_end()

    def report(self):
        buf = b"".join(p.detach().float().cpu().numpy().tobytes()
                       for _, p in self.model.module.named_parameters())
        if self.rank == 0:
            print("FINAL_SHA256", hashlib.sha256(buf).hexdigest(), flush=True)


if __name__ == "__main__":
    tr = DDPTrainer(HPARAMS)
    tr.fit()
    tr.report()
    dist.barrier()
    dist.destroy_process_group()
