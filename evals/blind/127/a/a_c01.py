"""DDP trainer over ranks with different micro-batch sizes (3 rows on rank 0,
5 on rank 1). Each window's loss is a sum over the window's all-ranks row
count; epochs of 8 micro-batches at K = 3 give 3-3-2 windows. Training stops
after epoch 1, checkpoints, and a freshly built trainer resumes epoch 2."""
import hashlib
import os
import tempfile
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


@dataclass
class Cfg:
    seed: int = 5
    dim: int = 16
    accum: int = 3
    micro_per_epoch: int = 8
    epochs: int = 2
    lr: float = 2e-3


def rows_for(rank):
    return 3 if rank == 0 else 5


def build_data(cfg, world):
    g = torch.Generator().manual_seed(cfg.seed + 11)
    w = torch.randn(cfg.dim, 2, generator=g)
    out = []
    for ep in range(cfg.epochs):
        per_rank = []
        for r in range(world):
            mbs = []
            for _ in range(cfg.micro_per_epoch):
                x = torch.randn(rows_for(r), cfg.dim, generator=g)
                y = torch.tanh(x @ w) + 0.05 * torch.randn(rows_for(r), 2, generator=g)
                mbs.append((x, y))
            per_rank.append(mbs)
        out.append(per_rank)
    return out  # [epoch][rank][micro]


def make_model(cfg):
    return nn.Sequential(nn.Linear(cfg.dim, 32), nn.SiLU(), nn.Linear(32, 32), nn.SiLU(),
                         nn.Linear(32, 2))


class Trainer:
    def __init__(self, cfg, rank, world, state=None):
        self.cfg, self.rank, self.world = cfg, rank, world
        torch.manual_seed(cfg.seed)
        net = make_model(cfg)
        if state is not None:
            net.load_state_dict(state["model"])
        self.model = DDP(net)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=cfg.lr, weight_decay=0.01)
        if state is not None:
            self.opt.load_state_dict(state["opt"])

    def windows(self, mbs):
        K = self.cfg.accum
        for s in range(0, len(mbs), K):
            yield mbs[s:s + K]

    def run_epoch(self, mbs):
        for win in self.windows(mbs):
            n_local = torch.tensor(float(sum(x.shape[0] for x, _ in win)))
            dist.all_reduce(n_local, op=dist.ReduceOp.SUM)
            n_total = n_local.item()
            for j, (x, y) in enumerate(win):
                last = j == len(win) - 1
                if last:
                    loss = ((self.model(x) - y) ** 2).sum() * self.world / n_total
                    loss.backward()
                else:
                    with self.model.no_sync():
                        loss = ((self.model(x) - y) ** 2).sum() * self.world / n_total
                        loss.backward()
            self.opt.step()
            self.opt.zero_grad(set_to_none=True)

    def state(self):
        return {"model": self.model.module.state_dict(), "opt": self.opt.state_dict()}


def digest(module):
    flat = torch.cat([p.detach().float().reshape(-1) for _, p in module.named_parameters()])
    return hashlib.sha256(flat.numpy().astype(np.float32).tobytes()).hexdigest()


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    cfg = Cfg()
    data = build_data(cfg, world)
    ckpt = os.path.join(tempfile.gettempdir(), f"a_c01_{os.environ.get('MASTER_PORT', '0')}.pt")

    trainer = Trainer(cfg, rank, world)
    trainer.run_epoch(data[0][rank])
    if rank == 0:
        torch.save(trainer.state(), ckpt)
    dist.barrier()
    del trainer

    state = torch.load(ckpt, weights_only=False)
    trainer = Trainer(cfg, rank, world, state=state)
    for ep in range(1, cfg.epochs):
        trainer.run_epoch(data[ep][rank])
    h = digest(trainer.model.module)
    dist.barrier()
    if rank == 0:
        os.remove(ckpt)
        print(f"FINAL_SHA256 {h}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
