"""Tabular regression fine-tune with Accelerate (2 processes, gradient accumulation)."""
import hashlib
from dataclasses import dataclass

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset
from accelerate import Accelerator
from accelerate.utils import set_seed


@dataclass
class RunConfig:
    seed: int = 1234
    n_samples: int = 80          # 40 per process -> 10 micro-batches per process
    micro_batch: int = 4
    grad_accum: int = 4
    epochs: int = 2
    lr: float = 0.05
    momentum: float = 0.9
    d_in: int = 16
    d_hidden: int = 32


def make_data(cfg):
    g = torch.Generator().manual_seed(cfg.seed)
    x = torch.randn(cfg.n_samples, cfg.d_in, generator=g)
    w = torch.randn(cfg.d_in, 1, generator=g)
    y = torch.tanh(x @ w) + 0.1 * torch.randn(cfg.n_samples, 1, generator=g)
    return TensorDataset(x, y)


class Regressor(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(cfg.d_in, cfg.d_hidden), nn.GELU(),
                                 nn.Linear(cfg.d_hidden, cfg.d_hidden), nn.GELU(),
                                 nn.Linear(cfg.d_hidden, 1))

    def forward(self, x):
        return self.net(x)


class Runner:
    def __init__(self, cfg: RunConfig):
        self.cfg = cfg
        self.accelerator = Accelerator(cpu=True, gradient_accumulation_steps=cfg.grad_accum)
        set_seed(cfg.seed)
        model = Regressor(cfg)
        opt = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=cfg.momentum)
        loader = DataLoader(make_data(cfg), batch_size=cfg.micro_batch, shuffle=False)
        self.model, self.opt, self.loader = self.accelerator.prepare(model, opt, loader)
        self.loss_fn = nn.MSELoss()

    def train_epoch(self, epoch):
        K = self.cfg.grad_accum
        n_batches = len(self.loader)
        for i, (x, y) in enumerate(self.loader):
            with self.accelerator.accumulate(self.model):
                loss = self.loss_fn(self.model(x), y)
                tail = n_batches % K
                if tail and i >= n_batches - tail:  # short last window: mean over its own batches
                    loss = loss * K / tail
                self.accelerator.backward(loss)
                self.opt.step()
                self.opt.zero_grad()
        self.accelerator.print(f"epoch {epoch} last loss {loss.item():.5f}")

    def fit(self):
        for epoch in range(self.cfg.epochs):
            self.train_epoch(epoch)
        self.accelerator.wait_for_everyone()
        if self.accelerator.is_main_process:
            h = hashlib.sha256()
            for _, p in self.accelerator.unwrap_model(self.model).named_parameters():
                h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
            print(f"FINAL_SHA256 {h.hexdigest()}")


if __name__ == "__main__":
    Runner(RunConfig()).fit()
