"""Tabular regression with Accelerate + DeepSpeed ZeRO-2.

DeepSpeed owns gradient accumulation (gradient_accumulation_steps in the ds
config), so the loop just calls accelerator.backward / optimizer.step.
"""
import hashlib
from dataclasses import dataclass, field

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from accelerate import Accelerator
from accelerate.utils import DeepSpeedPlugin, InitProcessGroupKwargs, set_seed


@dataclass
class RunConfig:
    seed: int = 1234
    in_dim: int = 24
    hidden: int = 64
    out_dim: int = 3
    micro_batch: int = 4
    grad_accum: int = 4
    windows: int = 6
    lr: float = 3e-3
    weight_decay: float = 0.01
    ds_zero: dict = field(default_factory=lambda: {"stage": 2, "overlap_comm": False,
                                                   "contiguous_gradients": True})


class Regressor(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(cfg.in_dim, cfg.hidden), nn.GELU(),
                                  nn.Linear(cfg.hidden, cfg.hidden), nn.GELU())
        self.head = nn.Linear(cfg.hidden, cfg.out_dim)

    def forward(self, x):
        return self.head(self.body(x))


def make_data(cfg, world):
    g = torch.Generator().manual_seed(cfg.seed)
    n = cfg.micro_batch * cfg.grad_accum * cfg.windows * world
    x = torch.randn(n, cfg.in_dim, generator=g)
    w = torch.randn(cfg.in_dim, cfg.out_dim, generator=g)
    y = torch.tanh(x @ w) + 0.1 * torch.randn(n, cfg.out_dim, generator=g)
    return TensorDataset(x, y)


class Runner:
    def __init__(self, cfg: RunConfig):
        self.cfg = cfg
        ds_config = {
            "train_micro_batch_size_per_gpu": cfg.micro_batch,
            "gradient_accumulation_steps": cfg.grad_accum,
            "gradient_clipping": 0.0,
            "zero_optimization": cfg.ds_zero,
            "steps_per_print": 10 ** 9,
        }
        self.accelerator = Accelerator(
            gradient_accumulation_steps=cfg.grad_accum,
            deepspeed_plugin=DeepSpeedPlugin(hf_ds_config=ds_config),
            kwargs_handlers=[InitProcessGroupKwargs(backend="gloo")],
        )
        set_seed(cfg.seed)
        model = Regressor(cfg)
        opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
        loader = DataLoader(make_data(cfg, self.accelerator.num_processes),
                            batch_size=cfg.micro_batch, shuffle=False)
        self.model, self.optimizer, self.loader = self.accelerator.prepare(model, opt, loader)

    def compute_loss(self, batch):
        x, y = batch
        return F.mse_loss(self.model(x), y)

    def train(self):
        self.model.train()
        for step, batch in enumerate(self.loader):
            loss = self.compute_loss(batch)
            self.accelerator.backward(loss)
            self.optimizer.step()
            self.optimizer.zero_grad()
        return self

    def final_digest(self):
        h = hashlib.sha256()
        for _, p in self.model.module.named_parameters():
            h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
        return h.hexdigest()


def main():
    runner = Runner(RunConfig()).train()
    digest = runner.final_digest()
    if runner.accelerator.is_main_process:
        print(f"FINAL_SHA256 {digest}", flush=True)
    runner.accelerator.wait_for_everyone()
    runner.accelerator.end_training()


if __name__ == "__main__":
    main()
