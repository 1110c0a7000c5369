"""Accelerate: a feature encoder and a separate prediction head, each with its own optimizer,
trained with accelerator.accumulate over K=4 micro-batches on 2 processes; clip at 0.5."""
import hashlib
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
from accelerate import Accelerator
from accelerate.utils import set_seed
from torch.utils.data import DataLoader, TensorDataset


@dataclass
class Config:
    seed: int = 7
    micro_batch: int = 4
    grad_accum: int = 4
    n_samples: int = 384  # 2 ranks x 4 x 4 -> 32 per update, 12 updates
    enc_lr: float = 2e-3
    head_lr: float = 5e-3
    max_grad_norm: float = 0.5
    d_in: int = 12
    d_hid: int = 48


def make_data(cfg):
    g = torch.Generator().manual_seed(cfg.seed)
    x = torch.randn(cfg.n_samples, cfg.d_in, generator=g)
    w = torch.randn(cfg.d_in, 3, generator=g)
    y = (x @ w).argmax(-1)
    return TensorDataset(x, y)


def clip_all(accelerator, models, max_norm):
    params = [p for m in models for p in m.parameters()]
    return accelerator.clip_grad_norm_(params, max_norm)


def train(cfg: Config):
    accelerator = Accelerator(gradient_accumulation_steps=cfg.grad_accum, cpu=True)
    set_seed(cfg.seed)
    encoder = nn.Sequential(nn.Linear(cfg.d_in, cfg.d_hid), nn.Tanh(), nn.Linear(cfg.d_hid, cfg.d_hid), nn.Tanh())
    head = nn.Linear(cfg.d_hid, 3)
    enc_opt = torch.optim.AdamW(encoder.parameters(), lr=cfg.enc_lr, weight_decay=0.01)
    head_opt = torch.optim.SGD(head.parameters(), lr=cfg.head_lr * 10, momentum=0.9)
    loader = DataLoader(make_data(cfg), batch_size=cfg.micro_batch, shuffle=False)
    encoder, head, enc_opt, head_opt, loader = accelerator.prepare(encoder, head, enc_opt, head_opt, loader)

    encoder.train()
    head.train()
    for x, y in loader:
        with accelerator.accumulate(encoder, head):
            logits = head(encoder(x))
            loss = F.cross_entropy(logits, y)
            accelerator.backward(loss)
            if accelerator.sync_gradients:
                clip_all(accelerator, (encoder, head), cfg.max_grad_norm)
            enc_opt.step()
            head_opt.step()
            enc_opt.zero_grad()
            head_opt.zero_grad()

    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        full = nn.ModuleDict({"encoder": accelerator.unwrap_model(encoder), "head": accelerator.unwrap_model(head)})
        h = hashlib.sha256()
        for _, p in full.named_parameters():
            h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
    accelerator.end_training()


if __name__ == "__main__":
    train(Config())
