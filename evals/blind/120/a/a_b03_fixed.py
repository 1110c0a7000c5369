"""Text classifier (bag of embeddings) on DDP, trainer class with a gradient-norm guard.

K micro-steps per window; the first K-1 backwards run under no_sync().
"""
import contextlib
import hashlib
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP


@dataclass
class Hparams:
    vocab: int = 200
    dim: int = 32
    classes: int = 4
    seq: int = 12
    micro_bs: int = 8
    accum: int = 3
    steps: int = 10
    lr: float = 0.05
    max_grad_norm: float = 0.08
    seed: int = 99


class GradNormGuard:
    """Keeps the gradient norm of a module bounded."""

    def __init__(self, params, max_norm):
        self.params = [p for p in params if p.requires_grad]
        self.max_norm = max_norm

    def __call__(self):
        return torch.nn.utils.clip_grad_norm_(self.params, self.max_norm)


class BagClassifier(nn.Module):
    def __init__(self, hp):
        super().__init__()
        self.emb = nn.EmbeddingBag(hp.vocab, hp.dim, mode="mean")
        self.mlp = nn.Sequential(nn.Linear(hp.dim, hp.dim), nn.ReLU(), nn.Linear(hp.dim, hp.classes))

    def forward(self, tokens):
        return self.mlp(self.emb(tokens))


class Trainer:
    def __init__(self, hp):
        self.hp = hp
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        torch.manual_seed(hp.seed)
        self.model = DDP(BagClassifier(hp))
        self.opt = torch.optim.SGD(self.model.parameters(), lr=hp.lr, momentum=0.9)
        self.guard = GradNormGuard(self.model.parameters(), hp.max_grad_norm)
        self.gen = torch.Generator().manual_seed(hp.seed + 1 + self.rank)
        self.micro = 0

    def sample(self):
        hp = self.hp
        tok = torch.randint(0, hp.vocab, (hp.micro_bs, hp.seq), generator=self.gen)
        y = (tok[:, :3].sum(-1) % hp.classes)
        return tok, y

    def backward(self, loss, sync):
        ctx = contextlib.nullcontext() if sync else self.model.no_sync()
        with ctx:
            loss.backward()
        if sync:
            self.guard()

    def train_step(self):
        hp = self.hp
        sync = (self.micro + 1) % hp.accum == 0
        ctx = contextlib.nullcontext() if sync else self.model.no_sync()
        tok, y = self.sample()
        with ctx:
            loss = F.cross_entropy(self.model(tok), y) / hp.accum
        self.backward(loss, sync)
        self.micro += 1
        if sync:
            self.opt.step()
            self.opt.zero_grad(set_to_none=True)
        return loss.item()

    def fit(self):
        for _ in range(self.hp.steps * self.hp.accum):
            loss = self.train_step()
            if self.rank == 0 and self.micro % (3 * self.hp.accum) == 0:
                print(f"micro {self.micro} loss {loss * self.hp.accum:.4f}", flush=True)

    def digest(self):
        h = hashlib.sha256()
        for _, p in self.model.module.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        return h.hexdigest()


def main():
    dist.init_process_group("gloo")
    torch.use_deterministic_algorithms(True)
    t = Trainer(Hparams())
    t.fit()
    d = t.digest()
    if dist.get_rank() == 0:
        print(f"FINAL_SHA256 {d}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
