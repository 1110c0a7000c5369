"""FSDP2 (fully_shard) trainer with bf16 compute / fp32 reduction, decay and no-decay
parameter groups, a global-norm clip on the sharded gradients, warm-up + cosine LR,
and a preemption-style checkpoint: the run trains part of the budget, writes a full
checkpoint, tears everything down and resumes into freshly built objects.

Spawns its own 2 ranks:  python b_b02.py
"""
import hashlib
import math
import os
import sys
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

PORT = int(sys.argv[1]) if len(sys.argv) > 1 else 49111
HERE = os.path.dirname(os.path.abspath(__file__))


@dataclass
class Config:
    grad_accum: int = 4
    micro_bs: int = 6
    max_steps: int = 12          # optimizer steps
    preempt_at: int = 6          # optimizer steps done before the simulated preemption
    warmup: int = 3
    lr: float = 2e-3
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.05
    clip: float = 0.5
    d_model: int = 32
    n_blocks: int = 3
    seed: int = 7


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 4 * d)
        self.fc2 = nn.Linear(4 * d, d)

    def forward(self, x):
        return x + self.fc2(F.gelu(self.fc1(self.norm(x))))


class Net(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.inp = nn.Linear(12, cfg.d_model)
        self.blocks = nn.ModuleList([Block(cfg.d_model) for _ in range(cfg.n_blocks)])
        self.out = nn.Linear(cfg.d_model, 3)

    def forward(self, x):
        h = self.inp(x)
        for b in self.blocks:
            h = b(h)
        return self.out(h)


def lr_lambda_factory(cfg):
    def fn(step):
        if step < cfg.warmup:
            return (step + 1) / cfg.warmup
        t = min(1.0, (step - cfg.warmup) / max(1, cfg.max_steps - cfg.warmup))
        return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * t))
    return fn


class FSDPTrainer:
    def __init__(self, cfg, rank, world):
        self.cfg, self.rank, self.world = cfg, rank, world
        g = torch.Generator().manual_seed(cfg.seed + 100)
        n = cfg.max_steps * cfg.grad_accum * cfg.micro_bs * world
        self.x = torch.randn(n, 12, generator=g)
        self.y = (self.x[:, :3] * self.x[:, 3:6]).sin() + 0.05 * torch.randn(n, 3, generator=g)
        self.ckpt_path = os.path.join(HERE, "tmp_scratch", os.path.basename(__file__) + ".ckpt")
        self.build()

    # -- construction -------------------------------------------------------
    def build(self):
        cfg = self.cfg
        torch.manual_seed(cfg.seed)
        model = Net(cfg)
        mp_policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        for blk in model.blocks:
            fully_shard(blk, mp_policy=mp_policy)
        fully_shard(model, mp_policy=mp_policy)
        self.model = model
        decay, no_decay = [], []
        for name, p in model.named_parameters():
            (no_decay if p.ndim < 2 else decay).append(p)
        self.opt = torch.optim.AdamW(
            [{"params": decay, "weight_decay": cfg.weight_decay},
             {"params": no_decay, "weight_decay": 0.0}],
            lr=cfg.lr, betas=(0.9, 0.95))
        self.micro_step = 0
        self.sched = self.build_scheduler(done=0)

    def build_scheduler(self, done):
        sched = torch.optim.lr_scheduler.LambdaLR(self.opt, lr_lambda_factory(self.cfg))
        for _ in range(done):          # fast-forward to where the run stopped
            sched.step()
        return sched

    # -- checkpointing ------------------------------------------------------
    def save(self):
        opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
        msd = get_model_state_dict(self.model, options=opts)
        osd = get_optimizer_state_dict(self.model, self.opt, options=opts)
        if self.rank == 0:
            torch.save({"model": msd, "optim": osd, "iter": self.micro_step}, self.ckpt_path)
        dist.barrier()

    def resume(self):
        ckpt = torch.load(self.ckpt_path, weights_only=False)
        self.build()
        opts = StateDictOptions(full_state_dict=True)
        set_model_state_dict(self.model, ckpt["model"], options=opts)
        set_optimizer_state_dict(self.model, self.opt, ckpt["optim"], options=opts)
        self.micro_step = ckpt["iter"]
        self.sched = self.build_scheduler(done=ckpt["iter"] // self.cfg.grad_accum)
        dist.barrier()

    # -- training -----------------------------------------------------------
    def batch(self, i):
        b = self.cfg.micro_bs
        lo = (i * self.world + self.rank) * b
        return self.x[lo: lo + b], self.y[lo: lo + b]

    def train_until(self, opt_steps):
        K = self.cfg.grad_accum
        while self.micro_step < opt_steps * K:
            k = self.micro_step % K
            last = k == K - 1
            self.model.set_requires_gradient_sync(last)
            x, y = self.batch(self.micro_step)
            loss = F.mse_loss(self.model(x).float(), y)
            (loss / K).backward()
            self.micro_step += 1
            if last:
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.clip)
                self.opt.step()
                self.sched.step()
                self.opt.zero_grad(set_to_none=True)

    def final_sha(self):
        h = hashlib.sha256()
        for _, p in self.model.named_parameters():
            t = p.full_tensor() if isinstance(p, DTensor) else p
            h.update(t.detach().float().cpu().contiguous().numpy().tobytes())
        return h.hexdigest()


def worker(rank, world):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(PORT))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    cfg = Config()
    tr = FSDPTrainer(cfg, rank, world)
    tr.train_until(cfg.preempt_at)
    tr.save()
    del tr.model, tr.opt, tr.sched       # simulated preemption
    tr.resume()
    tr.train_until(cfg.max_steps)
    sha = tr.final_sha()
    if rank == 0:
        print(f"FINAL_SHA256 {sha}")
        os.remove(tr.ckpt_path)
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(worker, args=(2,), nprocs=2, join=True)
