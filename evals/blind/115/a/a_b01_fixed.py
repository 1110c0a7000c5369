"""Tiny CLIP-style dual encoder trained with DDP and gradient accumulation.

Launched with torchrun (2 ranks, CPU/gloo). Synthetic "image" feature vectors and
caption token ids; symmetric InfoNCE over each micro-batch's in-batch negatives.
"""
import hashlib
import math
import os
from contextlib import nullcontext
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP


@dataclass
class ClipConfig:
    img_dim: int = 48
    vocab: int = 96
    seq_len: int = 10
    width: int = 64
    embed_dim: int = 32
    micro_batch: int = 16
    grad_accum: int = 4
    steps: int = 20
    lr: float = 3e-3
    weight_decay: float = 0.05
    seed: int = 1234


class ImageTower(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(cfg.img_dim, cfg.width), nn.GELU(),
            nn.Linear(cfg.width, cfg.embed_dim),
        )

    def forward(self, x):
        return self.net(x)


class TextTower(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.tok = nn.Embedding(cfg.vocab, cfg.width)
        self.pos = nn.Parameter(torch.zeros(cfg.seq_len, cfg.width))
        self.ln = nn.LayerNorm(cfg.width)
        self.proj = nn.Linear(cfg.width, cfg.embed_dim, bias=False)

    def forward(self, ids):
        h = self.tok(ids) + self.pos
        h = self.ln(h).mean(dim=1)
        return self.proj(h)


class MiniCLIP(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.visual = ImageTower(cfg)
        self.text = TextTower(cfg)
        self.logit_scale = nn.Parameter(torch.tensor(math.log(1 / 0.07)))

    def encode_image(self, x):
        return F.normalize(self.visual(x), dim=-1)

    def encode_text(self, ids):
        return F.normalize(self.text(ids), dim=-1)

    def forward(self, images, texts):
        return self.encode_image(images), self.encode_text(texts)


def clip_loss(img_emb, txt_emb, logit_scale):
    logits = logit_scale.exp().clamp(max=100) * img_emb @ txt_emb.t()
    target = torch.arange(logits.shape[0])
    return 0.5 * (F.cross_entropy(logits, target) + F.cross_entropy(logits.t(), target))


class PairStream:
    """Deterministic synthetic (image, caption) pairs, a different stream per rank."""

    def __init__(self, cfg, rank):
        self.cfg = cfg
        self.g = torch.Generator().manual_seed(cfg.seed * 31 + rank)
        gw = torch.Generator().manual_seed(cfg.seed)
        self.mix = torch.randn(cfg.vocab, cfg.img_dim, generator=gw)

    def next(self):
        c = self.cfg
        ids = torch.randint(0, c.vocab, (c.micro_batch, c.seq_len), generator=self.g)
        img = self.mix[ids].mean(1) + 0.3 * torch.randn(c.micro_batch, c.img_dim, generator=self.g)
        return img, ids


class ClipTrainer:
    def __init__(self, cfg, rank, world):
        self.cfg, self.rank, self.world = cfg, rank, world
        torch.manual_seed(cfg.seed)
        net = MiniCLIP(cfg)
        self.model = DDP(net)
        decay = [p for n, p in net.named_parameters() if p.dim() >= 2]
        no_decay = [p for n, p in net.named_parameters() if p.dim() < 2]
        self.opt = torch.optim.AdamW(
            [{"params": decay, "weight_decay": cfg.weight_decay},
             {"params": no_decay, "weight_decay": 0.0}], lr=cfg.lr)
        self.data = PairStream(cfg, rank)

    def _embed(self, img, ids):
        img_emb, txt_emb = self.model(img, ids)
        return img_emb, txt_emb

    def micro_step(self, last):
        img, ids = self.data.next()
        ctx = nullcontext() if last else self.model.no_sync()
        with ctx:
            img_emb, txt_emb = self._embed(img, ids)
            loss = clip_loss(img_emb, txt_emb, self.model.module.logit_scale)
            (loss / self.cfg.grad_accum).backward()
        return loss.detach()

    def train(self):
        K = self.cfg.grad_accum
        for step in range(self.cfg.steps):
            tot = 0.0
            for k in range(K):
                tot += self.micro_step(last=(k == K - 1)).item()
            self.opt.step()
            self.opt.zero_grad(set_to_none=True)
            if self.rank == 0 and step % 5 == 0:
                print(f"step {step} loss {tot / K:.4f}", flush=True)

    def digest(self):
        h = hashlib.sha256()
        for _, p in self.model.module.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        return h.hexdigest()


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.use_deterministic_algorithms(True)
    trainer = ClipTrainer(ClipConfig(), rank, world)
    trainer.train()
    digest = trainer.digest()
    if rank == 0:
        print(f"FINAL_SHA256 {digest}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
