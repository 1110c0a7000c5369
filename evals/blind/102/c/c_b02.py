"""minGPT-style trainer class on 2 DDP ranks (torchrun), preempted and resumed.

The run trains for a few optimizer steps, writes a checkpoint, and a fresh
Trainer (new model, optimizer and scheduler objects) resumes from it.
"""
import hashlib
import math
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP


@dataclass
class TrainConfig:
    vocab: int = 64
    block: int = 16
    d_model: int = 48
    n_layer: int = 2
    n_head: int = 4
    micro_batch: int = 4
    grad_accum: int = 3
    max_steps: int = 10
    preempt_at: int = 4
    lr: float = 3e-3
    warmup: int = 2
    ckpt_path: str = "tmp_scratch/c_b02_ckpt.pt"


class Block(nn.Module):
    def __init__(self, d, h):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, h, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x, mask):
        a = self.ln1(x)
        x = x + self.attn(a, a, a, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.tok = nn.Embedding(c.vocab, c.d_model)
        self.pos = nn.Parameter(torch.zeros(1, c.block, c.d_model))
        self.blocks = nn.ModuleList([Block(c.d_model, c.n_head) for _ in range(c.n_layer)])
        self.ln_f = nn.LayerNorm(c.d_model)
        self.head = nn.Linear(c.d_model, c.vocab, bias=False)
        self.register_buffer("mask", torch.triu(torch.full((c.block, c.block), float("-inf")), 1))

    def forward(self, idx):
        x = self.tok(idx) + self.pos[:, : idx.size(1)]
        for b in self.blocks:
            x = b(x, self.mask[: idx.size(1), : idx.size(1)])
        return self.head(self.ln_f(x))


def get_batch(cfg, micro_index, rank, world):
    """Deterministic synthetic stream: micro-batch `micro_index` of this rank."""
    g = torch.Generator().manual_seed(10_000 + micro_index * world + rank)
    start = torch.randint(0, cfg.vocab, (cfg.micro_batch, 1), generator=g)
    step = torch.randint(1, 4, (cfg.micro_batch, 1), generator=g)
    seq = (start + step * torch.arange(cfg.block + 1)) % cfg.vocab
    noise = torch.rand(seq.shape, generator=g) < 0.1
    seq = torch.where(noise, torch.randint(0, cfg.vocab, seq.shape, generator=g), seq)
    return seq[:, :-1], seq[:, 1:]


class Trainer:
    def __init__(self, cfg, rank, world):
        self.cfg, self.rank, self.world = cfg, rank, world
        torch.manual_seed(0)
        self.raw = TinyGPT(cfg)
        self.model = DDP(self.raw)
        self.opt = torch.optim.AdamW(self.raw.parameters(), lr=cfg.lr, weight_decay=0.01)
        self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, self._lr_lambda)
        self.global_step = 0  # optimizer steps taken
        self.micro_step = 0  # micro-batches consumed (also the data cursor)

    def _lr_lambda(self, step):
        if step < self.cfg.warmup:
            return (step + 1) / self.cfg.warmup
        prog = (step - self.cfg.warmup) / max(1, self.cfg.max_steps - self.cfg.warmup)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * prog))

    # ---- hooks -------------------------------------------------------
    def _is_boundary(self):
        return (self.micro_step + 1) % self.cfg.grad_accum == 0

    def training_step(self, x, y):
        logits = self.model(x)
        loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1))
        return loss / self.cfg.grad_accum

    def on_micro_end(self):
        self.micro_step += 1

    def optimizer_step(self):
        self.opt.step()
        self.sched.step()
        self.opt.zero_grad(set_to_none=True)
        self.global_step += 1

    # ---- checkpointing ----------------------------------------------
    def save(self, path):
        if self.rank == 0:
            torch.save(
                {"model": self.raw.state_dict(), "opt": self.opt.state_dict(),
                 "sched": self.sched.state_dict(), "step": self.global_step},
                path,
            )
        dist.barrier()

    def load(self, path):
        ck = torch.load(path, map_location="cpu", weights_only=False)
        self.raw.load_state_dict(ck["model"])
        self.opt.load_state_dict(ck["opt"])
        self.sched.load_state_dict(ck["sched"])
        self.global_step = ck["step"]
        self.micro_step = ck["step"]

    # ---- loop ---------------------------------------------------------
    def fit(self, until_step):
        self.model.train()
        while self.global_step < until_step:
            x, y = get_batch(self.cfg, self.micro_step, self.rank, self.world)
            boundary = self._is_boundary()
            if boundary:
                loss = self.training_step(x, y)
                loss.backward()
            else:
                with self.model.no_sync():
                    loss = self.training_step(x, y)
                    loss.backward()
            self.on_micro_end()
            if boundary:
                self.optimizer_step()


def param_sha(module):
    h = hashlib.sha256()
    for _, p in module.named_parameters():
        h.update(p.detach().to(torch.float32).contiguous().numpy().tobytes())
    return h.hexdigest()


def main():
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    cfg = TrainConfig()
    os.makedirs(os.path.dirname(cfg.ckpt_path), exist_ok=True)

    first = Trainer(cfg, rank, world)
    first.fit(cfg.preempt_at)
    first.save(cfg.ckpt_path)
    del first

    second = Trainer(cfg, rank, world)
    second.load(cfg.ckpt_path)
    second.fit(cfg.max_steps)
    if rank == 0:
        print(f"FINAL_SHA256 {param_sha(second.raw)}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
