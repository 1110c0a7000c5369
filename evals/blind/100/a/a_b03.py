"""Regression MLP with Hugging Face Accelerate: accumulate(), a quick mid-epoch validation probe.

Each window's loss is the mean over the samples of the window; the epoch's last window
is shorter (10 micro-batches per rank per epoch, K = 4) and is normalised by its own length.
"""
import hashlib
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
from accelerate import Accelerator
from accelerate.utils import GradientAccumulationPlugin, set_seed
from torch.utils.data import DataLoader, TensorDataset


@dataclass
class Cfg:
    grad_accum: int = 4
    micro_bs: int = 6
    n_train: int = 120       # 2 ranks x 10 micro-batches of 6
    n_val: int = 64
    epochs: int = 3
    lr: float = 3e-3
    eval_every: int = 5
    eval_batches: int = 2
    seed: int = 2024


W_TRUE = torch.randn(16, 3, generator=torch.Generator().manual_seed(99))


def make_split(n, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 16, generator=g)
    w = W_TRUE
    y = torch.tanh(x @ w) + 0.05 * torch.randn(n, 3, generator=g)
    return TensorDataset(x, y)


@torch.no_grad()
def quick_val(accelerator, model, val_dl, max_batches):
    model.eval()
    tot, n = 0.0, 0
    for i, (x, y) in enumerate(val_dl):
        if i >= max_batches:
            break
        tot += F.mse_loss(model(x), y, reduction="sum").item()
        n += y.numel()
    model.train()
    return tot / max(n, 1)


def main():
    cfg = Cfg()
    set_seed(cfg.seed)
    accelerator = Accelerator(
        cpu=True,
        gradient_accumulation_plugin=GradientAccumulationPlugin(num_steps=cfg.grad_accum),
    )
    model = nn.Sequential(nn.Linear(16, 64), nn.SiLU(), nn.Linear(64, 64), nn.SiLU(), nn.Linear(64, 3))
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.0)
    train_dl = DataLoader(make_split(cfg.n_train, cfg.seed), batch_size=cfg.micro_bs, shuffle=True,
                          generator=torch.Generator().manual_seed(cfg.seed))
    val_dl = DataLoader(make_split(cfg.n_val, cfg.seed + 1), batch_size=8)
    model, optimizer, train_dl, val_dl = accelerator.prepare(model, optimizer, train_dl, val_dl)

    K = cfg.grad_accum
    per_epoch = len(train_dl)
    for epoch in range(cfg.epochs):
        for step, (x, y) in enumerate(train_dl):
            window_len = min(K, per_epoch - (step // K) * K)
            with accelerator.accumulate(model):
                loss = F.mse_loss(model(x), y)
                # accelerator.backward divides by K; rescale so the window is a mean over its own micro-batches
                accelerator.backward(loss * K / window_len)
                optimizer.step()
                optimizer.zero_grad()
            if (step + 1) % cfg.eval_every == 0:
                v = quick_val(accelerator, model, val_dl, cfg.eval_batches)
                accelerator.print(f"epoch {epoch} step {step} val_mse {v:.4f}")

    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        h = hashlib.sha256()
        for _, p in accelerator.unwrap_model(model).named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
    accelerator.end_training()


if __name__ == "__main__":
    main()
