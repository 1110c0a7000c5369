"""Fine-tune a small tagger with gradual unfreezing (ULMFiT style) on DDP.

Epoch 0 trains the head only; from epoch 1 on the encoder is unfrozen and
gets its own parameter group with a lower learning rate.
"""
import hashlib
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP


@dataclass
class FinetuneConfig:
    vocab: int = 64
    dim: int = 32
    n_classes: int = 5
    seq: int = 12
    micro_bs: int = 4
    grad_accum: int = 2
    epochs: int = 3
    batches_per_epoch: int = 8
    head_lr: float = 3e-3
    encoder_lr: float = 1e-3
    unfreeze_at_epoch: int = 1
    seed: int = 1234


class Tagger(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab, cfg.dim)
        self.encoder = nn.Sequential(nn.Linear(cfg.dim, cfg.dim), nn.GELU(), nn.Linear(cfg.dim, cfg.dim))
        self.norm = nn.LayerNorm(cfg.dim)
        self.head = nn.Linear(cfg.dim, cfg.n_classes)

    def forward(self, ids):
        h = self.embed(ids)
        h = h + self.encoder(h)
        return self.head(self.norm(h))


def make_batches(cfg, rank, epoch):
    g = torch.Generator().manual_seed(cfg.seed * 100 + epoch * 10 + rank)
    out = []
    for _ in range(cfg.batches_per_epoch):
        ids = torch.randint(0, cfg.vocab, (cfg.micro_bs, cfg.seq), generator=g)
        tags = (ids * 7 + torch.roll(ids, 1, dims=1)) % cfg.n_classes
        out.append((ids, tags))
    return out


class UnfreezeTrainer:
    def __init__(self, cfg):
        self.cfg = cfg
        self.rank = dist.get_rank()
        torch.manual_seed(cfg.seed)
        self.net = Tagger(cfg)
        # start with only the head trainable
        for name, p in self.net.named_parameters():
            p.requires_grad_(name.startswith("head."))
        self.model = DDP(self.net)
        self.opt = torch.optim.AdamW(
            [p for p in self.net.parameters() if p.requires_grad], lr=cfg.head_lr, weight_decay=0.01
        )

    def unfreeze(self):
        newly = []
        for name, p in self.net.named_parameters():
            if not p.requires_grad:
                p.requires_grad_(True)
                newly.append(p)
        self.opt.add_param_group({"params": newly, "lr": self.cfg.encoder_lr, "weight_decay": 0.01})

    def micro_step(self, ids, tags, sync):
        ctx = self.model.no_sync() if not sync else torch.enable_grad()
        with ctx:
            logits = self.model(ids)
            loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), tags.reshape(-1))
            (loss / self.cfg.grad_accum).backward()
        return loss.detach()

    def train_epoch(self, epoch):
        K = self.cfg.grad_accum
        for i, (ids, tags) in enumerate(make_batches(self.cfg, self.rank, epoch)):
            last = (i + 1) % K == 0
            self.micro_step(ids, tags, sync=last)
            if last:
                self.opt.step()
                self.opt.zero_grad(set_to_none=True)

    def fit(self):
        for epoch in range(self.cfg.epochs):
            if epoch == self.cfg.unfreeze_at_epoch:
                self.unfreeze()
            self.train_epoch(epoch)


def param_digest(module):
    h = hashlib.sha256()
    for _, p in module.named_parameters():
        h.update(p.detach().to(torch.float32).contiguous().numpy().tobytes())
    return h.hexdigest()


def main():
    dist.init_process_group("gloo")
    torch.use_deterministic_algorithms(True)
    trainer = UnfreezeTrainer(FinetuneConfig())
    trainer.fit()
    if dist.get_rank() == 0:
        print("FINAL_SHA256", param_digest(trainer.net))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
