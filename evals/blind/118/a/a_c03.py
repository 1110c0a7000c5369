"""DDP trainer with two optimizers (AdamW body, SGD head), interrupted after 4 optimizer steps,
saved, rebuilt from scratch and resumed from the checkpoint for the remaining steps."""
import hashlib
import os
from contextlib import nullcontext

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

K, MICRO, TOTAL_STEPS, STOP_AT = 2, 5, 10, 4
CKPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tmp_scratch", "a_c03_ckpt.pt")


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(10, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh())
        self.head = nn.Linear(32, 3)

    def forward(self, x):
        return self.head(self.body(x))


def data_for(rank):
    g = torch.Generator().manual_seed(100 + rank)
    n = MICRO * K * TOTAL_STEPS
    x = torch.randn(n, 10, generator=g)
    return x, (x[:, 0] > 0).long() + (x[:, 1] > 0.5).long()


class Trainer:
    def __init__(self, rank):
        torch.manual_seed(0)
        self.rank = rank
        self.model = DDP(Model())
        m = self.model.module
        self.opt_body = torch.optim.AdamW(m.body.parameters(), lr=3e-3)
        self.opt_head = torch.optim.SGD(m.head.parameters(), lr=0.05, momentum=0.9)
        self.step = 0
        self.x, self.y = data_for(rank)

    def state_dict(self):
        return {"model": self.model.module.state_dict(), "opt_body": self.opt_body.state_dict(),
                "opt_head": self.opt_head.state_dict(), "step": self.step}

    def load_state_dict(self, sd):
        self.model.module.load_state_dict(sd["model"])
        self.opt_body.load_state_dict(sd["opt_body"])
        self.opt_head.load_state_dict(sd["opt_head"])
        self.step = sd["step"]

    def train_until(self, last_step):
        while self.step < last_step:
            base = self.step * K * MICRO
            for j in range(K):
                sl = slice(base + j * MICRO, base + (j + 1) * MICRO)
                ctx = self.model.no_sync() if j < K - 1 else nullcontext()
                with ctx:
                    loss = nn.functional.cross_entropy(self.model(self.x[sl]), self.y[sl]) / K
                    loss.backward()
            self.opt_body.step()
            self.opt_head.step()
            self.opt_body.zero_grad()
            self.opt_head.zero_grad()
            self.step += 1


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    t = Trainer(rank)
    t.train_until(STOP_AT)
    if rank == 0:
        os.makedirs(os.path.dirname(CKPT), exist_ok=True)
        torch.save(t.state_dict(), CKPT)
    dist.barrier()
    del t
    t = Trainer(rank)  # fresh objects, different init would be overwritten by the checkpoint
    t.load_state_dict(torch.load(CKPT, weights_only=False))
    t.train_until(TOTAL_STEPS)
    if rank == 0:
        h = hashlib.sha256()
        for _, p in t.model.module.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
