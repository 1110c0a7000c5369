"""SimCLR-style contrastive pre-training with a parameter-server update.

Every rank runs forward/backward on its own micro-batches; gradients are reduced
onto rank 0, rank 0 alone owns the optimizer (SGD + Nesterov momentum, as in the
SimCLR linear-scaling recipe) and broadcasts the new weights back.
"""
import hashlib
import os
from types import SimpleNamespace

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

CFG = SimpleNamespace(
    in_dim=32, hidden=64, proj_dim=16,
    batch_per_rank=16, accum_steps=2, total_updates=25,
    base_lr=0.3, momentum=0.9, temperature=0.2, seed=31,
)


class Encoder(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.backbone = nn.Sequential(nn.Linear(c.in_dim, c.hidden), nn.BatchNorm1d(c.hidden, track_running_stats=False),
                                      nn.ReLU(), nn.Linear(c.hidden, c.hidden), nn.ReLU())
        self.projector = nn.Sequential(nn.Linear(c.hidden, c.hidden), nn.ReLU(), nn.Linear(c.hidden, c.proj_dim))

    def forward(self, x):
        return self.projector(self.backbone(x))


def nt_xent(z1, z2, temperature):
    z = F.normalize(torch.cat([z1, z2]), dim=1)
    n = z1.shape[0]
    sim = z @ z.t() / temperature
    sim.fill_diagonal_(float("-inf"))
    targets = torch.cat([torch.arange(n, 2 * n), torch.arange(0, n)])
    return F.cross_entropy(sim, targets)


def augment(x, gen):
    keep = (torch.rand(x.shape, generator=gen) > 0.2).float()
    return x * keep + 0.1 * torch.randn(x.shape, generator=gen)


class ContrastiveTrainer:
    def __init__(self, cfg):
        self.cfg = cfg
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        torch.manual_seed(cfg.seed)
        self.model = Encoder(cfg)
        self.prototypes = torch.randn(8, cfg.in_dim, generator=torch.Generator().manual_seed(cfg.seed))
        self.gen = torch.Generator().manual_seed(cfg.seed + 17 * (self.rank + 1))
        self.opt = None
        if self.rank == 0:
            self.opt = torch.optim.SGD(self.model.parameters(), lr=cfg.base_lr,
                                       momentum=cfg.momentum, nesterov=True)

    def next_batch(self):
        idx = torch.randint(0, self.prototypes.shape[0], (self.cfg.batch_per_rank,), generator=self.gen)
        return self.prototypes[idx] + 0.5 * torch.randn(self.cfg.batch_per_rank, self.cfg.in_dim, generator=self.gen)

    def micro_step(self):
        x = self.next_batch()
        z1 = self.model(augment(x, self.gen))
        z2 = self.model(augment(x, self.gen))
        loss = nt_xent(z1, z2, self.cfg.temperature)
        loss.backward()
        return loss.detach()

    def reduce_gradients(self):
        for p in self.model.parameters():
            dist.reduce(p.grad, dst=0)
            if self.rank == 0:
                p.grad.div_(self.cfg.accum_steps)

    def broadcast_parameters(self):
        for p in self.model.parameters():
            dist.broadcast(p.data, src=0)

    def update(self):
        self.reduce_gradients()
        if self.rank == 0:
            self.opt.step()
        self.broadcast_parameters()
        self.model.zero_grad(set_to_none=True)

    def fit(self):
        for it in range(self.cfg.total_updates):
            losses = [self.micro_step() for _ in range(self.cfg.accum_steps)]
            self.update()
            if self.rank == 0 and (it + 1) % 5 == 0:
                print(f"update {it + 1} loss {torch.stack(losses).mean():.4f}", flush=True)

    def final_digest(self):
        h = hashlib.sha256()
        for _, p in self.model.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        return h.hexdigest()


def main():
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    trainer = ContrastiveTrainer(CFG)
    trainer.fit()
    if trainer.rank == 0:
        print(f"FINAL_SHA256 {trainer.final_digest()}", flush=True)
        if os.environ.get("DUMP_PARAMS"):
            torch.save([p.detach().clone() for p in trainer.model.parameters()], os.environ["DUMP_PARAMS"])
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
