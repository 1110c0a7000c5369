"""Intent classifier trained with FSDP2 (fully_shard) in bf16 compute / fp32 reduce.

A small trainer class: gradient sync is turned off for the first K-1 micro-batches
of each window, the grad norm is clipped and logged on the sync micro-batch, then
AdamW + a warm-up/cosine LambdaLR step once per window.
"""
import hashlib
import math
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.device_mesh import init_device_mesh


@dataclass
class TrainConfig:
    vocab: int = 200
    dim: int = 64
    n_blocks: int = 3
    n_classes: int = 12
    seq_len: int = 24
    micro_batch: int = 8
    grad_accum: int = 4
    max_steps: int = 10
    lr: float = 2e-3
    warmup: int = 2
    max_grad_norm: float = 0.25
    seed: int = 17


class Block(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.ff = nn.Sequential(nn.Linear(dim, 3 * dim), nn.SiLU(), nn.Linear(3 * dim, dim))

    def forward(self, x):
        return x + self.ff(self.norm(x))


class IntentNet(nn.Module):
    def __init__(self, c: TrainConfig):
        super().__init__()
        self.emb = nn.Embedding(c.vocab, c.dim)
        self.blocks = nn.ModuleList([Block(c.dim) for _ in range(c.n_blocks)])
        self.norm = nn.LayerNorm(c.dim)
        self.cls = nn.Linear(c.dim, c.n_classes)

    def forward(self, ids):
        h = self.emb(ids)
        for b in self.blocks:
            h = b(h)
        return self.cls(self.norm(h).mean(1))


def synthetic_batches(c: TrainConfig, rank, world):
    g = torch.Generator().manual_seed(c.seed)
    n = c.max_steps * c.grad_accum * c.micro_batch * world
    ids = torch.randint(0, c.vocab, (n, c.seq_len), generator=g)
    labels = (ids[:, :4].sum(1) * 7 + ids[:, -1]) % c.n_classes
    ids, labels = ids[rank::world], labels[rank::world]
    return list(zip(ids.split(c.micro_batch), labels.split(c.micro_batch)))


class FSDPTrainer:
    def __init__(self, c: TrainConfig):
        self.c = c
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        torch.manual_seed(c.seed)
        model = IntentNet(c)
        mesh = init_device_mesh("cpu", (self.world,))
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        for blk in model.blocks:
            fully_shard(blk, mesh=mesh, mp_policy=mp)
        self.model = fully_shard(model, mesh=mesh, mp_policy=mp)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=c.lr, weight_decay=0.05)

        def lr_lambda(step):
            if step < c.warmup:
                return (step + 1) / c.warmup
            t = (step - c.warmup) / max(1, c.max_steps - c.warmup)
            return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t))

        self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, lr_lambda)
        self.grad_norms = []

    def compute_loss(self, batch):
        ids, labels = batch
        logits = self.model(ids)
        return F.cross_entropy(logits.float(), labels)

    def clip_gradients(self):
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.c.max_grad_norm)
        self.grad_norms.append(float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm))

    def training_step(self, batch, sync: bool):
        self.model.set_requires_gradient_sync(sync)
        loss = self.compute_loss(batch) / self.c.grad_accum
        if sync:
            self.clip_gradients()
        loss.backward()
        return loss.detach()

    def optimizer_step(self):
        self.opt.step()
        self.sched.step()
        self.opt.zero_grad(set_to_none=True)

    def fit(self, batches):
        self.model.train()
        K = self.c.grad_accum
        for i, batch in enumerate(batches):
            sync = (i + 1) % K == 0
            self.training_step(batch, sync)
            if sync:
                self.optimizer_step()

    def final_digest(self):
        h = hashlib.sha256()
        full = {}
        for name, p in self.model.named_parameters():
            t = p.full_tensor().detach().float().contiguous()
            full[name] = t
            h.update(t.numpy().tobytes())
        return h.hexdigest(), full


def main():
    dist.init_process_group("gloo")
    c = TrainConfig()
    trainer = FSDPTrainer(c)
    trainer.fit(synthetic_batches(c, trainer.rank, trainer.world))
    digest, full = trainer.final_digest()
    if trainer.rank == 0:
        print(f"FINAL_SHA256 {digest}", flush=True)
        if os.environ.get("PARAM_DUMP"):
            torch.save(full, os.environ["PARAM_DUMP"])
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
