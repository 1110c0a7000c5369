"""DDPM-style denoiser on ranks started with mp.spawn, no DDP wrapper.

* gradients of a window are accumulated locally and averaged over ranks with a
  single flat all-reduce right before the step;
* two optimizers: AdamW for the denoiser body, SGD+momentum for the timestep
  embedding table;
* an EMA copy of the weights, updated after every optimizer step;
* the job is preempted in the middle of a window: every rank writes its own
  checkpoint that includes the partially accumulated .grad tensors, and fresh
  objects resume from it.
"""
import hashlib
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

WORLD = 2
PORT = 49222
DIM = 8
T_STEPS = 50
K = 3
MICRO_BS = 12
TOTAL_STEPS = 10
PREEMPT_MICRO = 4 * K + 1  # one micro-batch into window 5
EMA_DECAY = 0.9
CKPT_DIR = "tmp_scratch/c_c02_ckpt"


class Denoiser(nn.Module):
    def __init__(self):
        super().__init__()
        self.t_emb = nn.Embedding(T_STEPS, 16)
        self.body = nn.Sequential(nn.Linear(DIM + 16, 64), nn.SiLU(), nn.Linear(64, 64), nn.SiLU(), nn.Linear(64, DIM))

    def forward(self, x, t):
        return self.body(torch.cat([x, self.t_emb(t)], -1))


betas = torch.linspace(1e-4, 0.05, T_STEPS)
alpha_bar = torch.cumprod(1 - betas, 0)


def micro_batch(micro_idx, rank):
    g = torch.Generator().manual_seed(77_000 + micro_idx * WORLD + rank)
    x0 = torch.randn(MICRO_BS, DIM, generator=g) * 0.5 + torch.linspace(-1, 1, DIM)
    t = torch.randint(0, T_STEPS, (MICRO_BS,), generator=g)
    eps = torch.randn(MICRO_BS, DIM, generator=g)
    return x0, t, eps


class Runner:
    def __init__(self, rank):
        self.rank = rank
        torch.manual_seed(0)
        self.model = Denoiser()
        self.ema = Denoiser()
        self.ema.load_state_dict(self.model.state_dict())
        self.ema.requires_grad_(False)
        self.opt_body = torch.optim.AdamW(self.model.body.parameters(), lr=2e-3, weight_decay=0.01)
        self.opt_emb = torch.optim.SGD(self.model.t_emb.parameters(), lr=0.05, momentum=0.9)
        self.micro = 0

    def loss_fn(self, x0, t, eps):
        ab = alpha_bar[t].unsqueeze(-1)
        xt = ab.sqrt() * x0 + (1 - ab).sqrt() * eps
        return ((self.model(xt, t) - eps) ** 2).mean()

    def sync_grads(self):
        params = [p for p in self.model.parameters() if p.grad is not None]
        grads = [p.grad for p in params]
        flat = _flatten_dense_tensors(grads)
        dist.all_reduce(flat)
        flat.div_(dist.get_world_size())
        for p, g in zip(params, _unflatten_dense_tensors(flat, grads)):
            p.grad.copy_(g)

    def step(self):
        self.sync_grads()
        self.opt_body.step()
        self.opt_emb.step()
        self.opt_body.zero_grad(set_to_none=True)
        self.opt_emb.zero_grad(set_to_none=True)
        with torch.no_grad():
            for pe, pm in zip(self.ema.parameters(), self.model.parameters()):
                pe.lerp_(pm, 1 - EMA_DECAY)

    def run(self, until_micro):
        while self.micro < until_micro:
            x0, t, eps = micro_batch(self.micro, self.rank)
            (self.loss_fn(x0, t, eps) / K).backward()
            self.micro += 1
            if self.micro % K == 0:
                self.step()

    def save(self):
        os.makedirs(CKPT_DIR, exist_ok=True)
        torch.save({
            "model": self.model.state_dict(), "ema": self.ema.state_dict(),
            "opt_body": self.opt_body.state_dict(), "opt_emb": self.opt_emb.state_dict(),
            "micro": self.micro,
            "grads": {n: p.grad.clone() for n, p in self.model.named_parameters() if p.grad is not None},
        }, os.path.join(CKPT_DIR, f"rank{self.rank}.pt"))
        dist.barrier()

    def load(self):
        ck = torch.load(os.path.join(CKPT_DIR, f"rank{self.rank}.pt"), weights_only=False)
        self.model.load_state_dict(ck["model"])
        self.ema.load_state_dict(ck["ema"])
        self.opt_body.load_state_dict(ck["opt_body"])
        self.opt_emb.load_state_dict(ck["opt_emb"])
        self.micro = ck["micro"]
        for n, p in self.model.named_parameters():
            if n in ck["grads"]:
                p.grad = ck["grads"][n].clone()


def worker(rank):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(PORT)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    r = Runner(rank)
    r.run(PREEMPT_MICRO)
    r.save()
    del r
    r = Runner(rank)
    r.load()
    r.run(TOTAL_STEPS * K)
    if rank == 0:
        h = hashlib.sha256()
        for _, p in r.model.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(worker, nprocs=WORLD, join=True)
