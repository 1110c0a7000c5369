"""DDP fine-tuning with gradual unfreezing.

The backbone starts frozen (linear probing); after `unfreeze_at` optimizer steps
the body is released and trained together with the head.
"""
import argparse
import hashlib
import os
from contextlib import nullcontext

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def get_args():
    p = argparse.ArgumentParser()
    p.add_argument("--vocab", type=int, default=96)
    p.add_argument("--dim", type=int, default=48)
    p.add_argument("--classes", type=int, default=6)
    p.add_argument("--micro-bs", type=int, default=4)
    p.add_argument("--grad-accum", type=int, default=4)
    p.add_argument("--steps", type=int, default=24)
    p.add_argument("--unfreeze-at", type=int, default=8)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=1234)
    return p.parse_args()


class Classifier(nn.Module):
    def __init__(self, vocab, dim, classes):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.body = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, ids):
        h = self.emb(ids).mean(dim=1)
        h = h + self.body(h)
        return self.head(self.norm(h))


class GradualUnfreeze:
    """Callback: release `modules` once `at_step` optimizer steps are done."""

    def __init__(self, modules, at_step):
        self.modules = modules
        self.at_step = at_step
        self.done = False

    def freeze(self):
        for m in self.modules:
            for p in m.parameters():
                p.requires_grad_(False)

    def on_step_end(self, trainer):
        if self.done or trainer.opt_steps < self.at_step:
            return
        for m in self.modules:
            for p in m.parameters():
                p.requires_grad_(True)
        self.done = True


class Trainer:
    def __init__(self, args, model, loader, callbacks):
        self.args = args
        self.model = model
        self.loader = loader
        self.callbacks = callbacks
        self.ddp = DDP(self.model)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=args.lr, weight_decay=0.01)
        self.opt_steps = 0
        self.micro = 0

    def training_step(self, batch):
        ids, labels = batch
        logits = self.ddp(ids)
        return F.cross_entropy(logits, labels)

    def fit(self):
        K = self.args.grad_accum
        epoch = 0
        while self.opt_steps < self.args.steps:
            self.loader.sampler.set_epoch(epoch)
            for batch in self.loader:
                last = (self.micro + 1) % K == 0
                ctx = nullcontext() if last else self.ddp.no_sync()
                with ctx:
                    loss = self.training_step(batch)
                    (loss / K).backward()
                self.micro += 1
                if last:
                    self.optimizer.step()
                    self.optimizer.zero_grad(set_to_none=True)
                    self.opt_steps += 1
                    for cb in self.callbacks:
                        cb.on_step_end(self)
                    if self.opt_steps >= self.args.steps:
                        break
            epoch += 1


def main():
    args = get_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(args.seed)
    torch.use_deterministic_algorithms(True)

    g = torch.Generator().manual_seed(args.seed)
    n = args.micro_bs * args.grad_accum * world * 12
    ids = torch.randint(0, args.vocab, (n, 10), generator=g)
    labels = (ids[:, :3].sum(1) % args.classes)
    ds = TensorDataset(ids, labels)
    sampler = DistributedSampler(ds, num_replicas=world, rank=rank, shuffle=True, seed=args.seed)
    loader = DataLoader(ds, batch_size=args.micro_bs, sampler=sampler, drop_last=True)

    model = Classifier(args.vocab, args.dim, args.classes)
    unfreeze = GradualUnfreeze([model.emb, model.body], at_step=args.unfreeze_at)
    unfreeze.freeze()
    trainer = Trainer(args, model, loader, [unfreeze])
    trainer.fit()

    final = [(n, p.detach().float().contiguous()) for n, p in model.named_parameters()]
    h = hashlib.sha256()
    for _, t in final:
        h.update(t.numpy().tobytes())
    if rank == 0:
        print(f"FINAL_SHA256 {h.hexdigest()}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
