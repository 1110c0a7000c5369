"""Encoder + classification head trained with Accelerate, following the
`no_trainer` examples: gradient accumulation through `accelerator.accumulate`,
a warm-up + cosine schedule sized in optimizer updates."""
import hashlib
import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
from accelerate import Accelerator
from accelerate.utils import set_seed
from torch.utils.data import DataLoader, TensorDataset
from transformers import get_cosine_schedule_with_warmup


@dataclass
class RunConfig:
    seed: int = 1234
    in_dim: int = 24
    hidden: int = 64
    n_classes: int = 5
    micro_batch: int = 8
    grad_accum: int = 4
    epochs: int = 2
    n_samples: int = 512          # 256 per rank -> 32 micro-batches -> 8 updates per epoch
    lr_encoder: float = 3e-3
    lr_head: float = 1e-2
    warmup_steps: int = 3


class Encoder(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(cfg.in_dim, cfg.hidden), nn.GELU(),
                                 nn.Linear(cfg.hidden, cfg.hidden), nn.LayerNorm(cfg.hidden))

    def forward(self, x):
        return self.net(x)


class Head(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.proj = nn.Linear(cfg.hidden, cfg.n_classes)

    def forward(self, h):
        return self.proj(h)


def make_data(cfg):
    g = torch.Generator().manual_seed(cfg.seed)
    x = torch.randn(cfg.n_samples, cfg.in_dim, generator=g)
    w = torch.randn(cfg.in_dim, cfg.n_classes, generator=g)
    y = (x @ w + 0.3 * torch.randn(cfg.n_samples, cfg.n_classes, generator=g)).argmax(-1)
    return TensorDataset(x, y)


def params_sha(*modules):
    h = hashlib.sha256()
    for m in modules:
        for _, p in m.named_parameters():
            h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def main():
    cfg = RunConfig()
    # We drive the scheduler ourselves (no hidden num_processes multiplier).
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=cfg.grad_accum,
                              step_scheduler_with_optimizer=False)
    set_seed(cfg.seed)
    torch.use_deterministic_algorithms(True)

    encoder, head = Encoder(cfg), Head(cfg)
    optimizer = torch.optim.AdamW([
        {"params": encoder.parameters(), "lr": cfg.lr_encoder},
        {"params": head.parameters(), "lr": cfg.lr_head},
    ], weight_decay=0.01)
    loader = DataLoader(make_data(cfg), batch_size=cfg.micro_batch, shuffle=True,
                        generator=torch.Generator().manual_seed(cfg.seed))

    # sizes follow the per-process view of the loader
    updates_per_epoch = math.ceil(len(loader) / accelerator.num_processes / cfg.grad_accum)
    max_train_steps = cfg.epochs * updates_per_epoch
    lr_scheduler = get_cosine_schedule_with_warmup(optimizer, cfg.warmup_steps, max_train_steps)

    encoder, head, optimizer, loader, lr_scheduler = accelerator.prepare(
        encoder, head, optimizer, loader, lr_scheduler)

    updates = 0
    for epoch in range(cfg.epochs):
        encoder.train(); head.train()
        for step, (x, y) in enumerate(loader):
            with accelerator.accumulate(encoder, head):
                logits = head(encoder(x))
                loss = F.cross_entropy(logits, y)
                accelerator.backward(loss)
                optimizer.step()
                lr_scheduler.step()
                optimizer.zero_grad()
            if accelerator.sync_gradients:
                updates += 1
        accelerator.print(f"epoch {epoch} updates {updates} lr {lr_scheduler.get_last_lr()}")

    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        print("FINAL_SHA256", params_sha(accelerator.unwrap_model(encoder), accelerator.unwrap_model(head)))
    accelerator.end_training()


if __name__ == "__main__":
    main()
