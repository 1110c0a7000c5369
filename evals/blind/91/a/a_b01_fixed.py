"""LoRA fine-tuning of a small MLP regressor with Accelerate.

Gradient accumulation through `accelerator.accumulate`, PEFT LoRA on the hidden
layers, the output head fully trained via `modules_to_save`, linear warm-up/decay.
"""
import hashlib
import math
from dataclasses import dataclass

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset
from accelerate import Accelerator
from accelerate.utils import set_seed
from peft import LoraConfig, get_peft_model


@dataclass
class Config:
    seed: int = 1234
    n_samples: int = 128
    in_dim: int = 16
    hidden: int = 32
    micro_batch: int = 4
    grad_accum: int = 4
    epochs: int = 2
    lr: float = 3e-2
    warmup_steps: int = 2
    lora_r: int = 4


class Regressor(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.fc1 = nn.Linear(cfg.in_dim, cfg.hidden)
        self.fc2 = nn.Linear(cfg.hidden, cfg.hidden)
        self.head = nn.Linear(cfg.hidden, 1)

    def forward(self, x):
        h = torch.tanh(self.fc1(x))
        h = torch.tanh(self.fc2(h))
        return self.head(h).squeeze(-1)


def make_data(cfg: Config):
    g = torch.Generator().manual_seed(cfg.seed)
    x = torch.randn(cfg.n_samples, cfg.in_dim, generator=g)
    w = torch.randn(cfg.in_dim, generator=g)
    y = torch.sin(x @ w) + 0.1 * torch.randn(cfg.n_samples, generator=g)
    return TensorDataset(x, y)


def linear_warmup_decay(warmup, total):
    def fn(step):
        if step < warmup:
            return (step + 1) / warmup
        return max(0.0, (total - step) / max(1, total - warmup))
    return fn


def main():
    cfg = Config()
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=cfg.grad_accum)
    assert accelerator.num_processes == 2
    set_seed(cfg.seed)

    base = Regressor(cfg)
    lcfg = LoraConfig(r=cfg.lora_r, lora_alpha=8, target_modules=["fc1", "fc2"],
                      lora_dropout=0.0, modules_to_save=["head"])
    model = get_peft_model(base, lcfg)

    loader = DataLoader(make_data(cfg), batch_size=cfg.micro_batch, shuffle=False)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad],
                                  lr=cfg.lr, weight_decay=0.0)

    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)

    updates_per_epoch = math.ceil(len(loader) / cfg.grad_accum)
    total_updates = updates_per_epoch * cfg.epochs
    lr_scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, linear_warmup_decay(cfg.warmup_steps, total_updates))

    model.train()
    for epoch in range(cfg.epochs):
        for x, y in loader:
            with accelerator.accumulate(model):
                pred = model(x)
                loss = nn.functional.mse_loss(pred, y)
                accelerator.backward(loss)
                optimizer.step()
                if accelerator.sync_gradients:
                    lr_scheduler.step()
                optimizer.zero_grad()

    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        unwrapped = accelerator.unwrap_model(model)
        h = hashlib.sha256()
        for _, p in unwrapped.named_parameters():
            h.update(p.detach().to(torch.float32).contiguous().cpu().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}")


if __name__ == "__main__":
    main()
