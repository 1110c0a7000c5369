"""FSDP2 trainer for a small residual MLP language model with a learned
logit temperature (trained by its own SGD, the rest by AdamW).

Gradients are reduce-scattered once per window (sync deferred on the other
micro-steps)."""
import hashlib
import os
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard


@dataclass
class FSDPSettings:
    param_dtype: torch.dtype = torch.float32
    reduce_dtype: torch.dtype = torch.float32


@dataclass
class RunConfig:
    seed: int = 99
    vocab: int = 40
    dim: int = 32
    n_blocks: int = 3
    seq: int = 12
    micro_batch: int = 4
    grad_accum: int = 4
    steps: int = 10
    lr: float = 1e-3
    temp_lr: float = 0.05
    fsdp: FSDPSettings = field(default_factory=FSDPSettings)


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.ln = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 4 * d)
        self.fc2 = nn.Linear(4 * d, d)

    def forward(self, x):
        return x + self.fc2(F.gelu(self.fc1(self.ln(x))))


class TinyLM(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.emb = nn.Embedding(cfg.vocab, cfg.dim)
        self.blocks = nn.ModuleList([Block(cfg.dim) for _ in range(cfg.n_blocks)])
        self.ln_f = nn.LayerNorm(cfg.dim)
        self.head = nn.Linear(cfg.dim, cfg.vocab, bias=False)
        # fully_shard rejects scalar parameters, so the learned temperature is
        # a one-element parameter
        self.log_scale = nn.Parameter(torch.zeros(1))

    def temperature_params(self):
        return [self.log_scale]

    def forward(self, idx):
        h = self.emb(idx)
        for b in self.blocks:
            h = b(h)
        return self.head(self.ln_f(h)) * self.log_scale.exp()


class FSDPTrainer:
    def __init__(self, cfg: RunConfig):
        self.cfg = cfg
        dist.init_process_group("gloo")
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        torch.manual_seed(cfg.seed)
        self.model = self._shard(TinyLM(cfg))
        temp = self.model.temperature_params()
        temp_ids = {id(t) for t in temp}
        main = [p for p in self.model.parameters() if id(p) not in temp_ids]
        self.opts = [torch.optim.AdamW(main, lr=cfg.lr, weight_decay=0.0),
                     torch.optim.SGD(temp, lr=cfg.temp_lr, momentum=0.9)]
        self.data = self._data()

    def _shard(self, model):
        mp = MixedPrecisionPolicy(param_dtype=self.cfg.fsdp.param_dtype,
                                  reduce_dtype=self.cfg.fsdp.reduce_dtype)
        for blk in model.blocks:
            fully_shard(blk, mp_policy=mp)
        fully_shard(model, mp_policy=mp)
        return model

    def _data(self):
        c = self.cfg
        g = torch.Generator().manual_seed(c.seed + 3)
        n = c.steps * c.grad_accum * self.world
        start = torch.randint(0, c.vocab, (n, c.micro_batch, 1), generator=g)
        stride = torch.randint(1, 4, (n, c.micro_batch, 1), generator=g)
        seq = (start + stride * torch.arange(c.seq + 1)) % c.vocab
        return seq[self.rank::self.world]

    def _micro(self, i, sync):
        self.model.set_requires_gradient_sync(sync)
        toks = self.data[i]
        logits = self.model(toks[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, self.cfg.vocab), toks[:, 1:].reshape(-1))
        (loss / self.cfg.grad_accum).backward()
        return loss.detach()

    def train(self):
        K = self.cfg.grad_accum
        for step in range(self.cfg.steps):
            for k in range(K):
                loss = self._micro(step * K + k, sync=(k == K - 1))
            for opt in self.opts:
                opt.step()
            for opt in self.opts:
                opt.zero_grad()
            if self.rank == 0 and (step + 1) % 3 == 0:
                print(f"step {step + 1} loss {loss.item():.4f}", flush=True)

    def digest(self):
        parts = [p.full_tensor().detach().float().reshape(-1)
                 for _, p in self.model.named_parameters()]
        flat = torch.cat(parts)
        return hashlib.sha256(flat.numpy().astype(np.float32).tobytes()).hexdigest()


def main():
    trainer = FSDPTrainer(RunConfig())
    trainer.train()
    h = trainer.digest()
    if trainer.rank == 0:
        print(f"FINAL_SHA256 {h}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
