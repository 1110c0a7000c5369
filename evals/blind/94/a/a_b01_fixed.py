"""Intent classifier fine-tune with Accelerate.

The loop pulls one accumulation window at a time from the prepared loader and hands it to
`Runner.train_window`, which backpropagates the window and takes one optimizer step.
"""
import hashlib
import itertools
import math
import os
from dataclasses import dataclass

import torch
import torch.nn as nn
from accelerate import Accelerator
from accelerate.utils import set_seed
from torch.utils.data import DataLoader, TensorDataset


@dataclass
class RunConfig:
    seed: int = 17
    n_samples: int = 192
    micro_batch: int = 4
    accum: int = 4
    epochs: int = 2
    lr_body: float = 2e-3
    lr_head: float = 5e-3
    warmup: int = 2
    n_features: int = 24
    n_classes: int = 5


class IntentNet(nn.Module):
    def __init__(self, d_in, n_cls):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(d_in, 48), nn.GELU(), nn.LayerNorm(48), nn.Linear(48, 48), nn.GELU())
        self.head = nn.Linear(48, n_cls)

    def forward(self, x):
        return self.head(self.body(x))


def build_accelerator(cfg: RunConfig) -> Accelerator:
    # train_window() already accumulates a whole window and steps once per window
    return Accelerator(cpu=True, gradient_accumulation_steps=1)


def windows(loader, k):
    it = iter(loader)
    while True:
        chunk = list(itertools.islice(it, k))
        if not chunk:
            return
        yield chunk


class Runner:
    def __init__(self, cfg: RunConfig):
        self.cfg = cfg
        self.accelerator = build_accelerator(cfg)
        set_seed(cfg.seed)
        g = torch.Generator().manual_seed(cfg.seed)
        x = torch.randn(cfg.n_samples, cfg.n_features, generator=g)
        w = torch.randn(cfg.n_features, cfg.n_classes, generator=g)
        y = (x @ w + 0.5 * torch.randn(cfg.n_samples, cfg.n_classes, generator=g)).argmax(-1)
        loader = DataLoader(TensorDataset(x, y), batch_size=cfg.micro_batch, shuffle=True,
                            generator=torch.Generator().manual_seed(cfg.seed))
        model = IntentNet(cfg.n_features, cfg.n_classes)
        opt = torch.optim.AdamW([
            {"params": model.body.parameters(), "lr": cfg.lr_body, "weight_decay": 0.01},
            {"params": model.head.parameters(), "lr": cfg.lr_head, "weight_decay": 0.0},
        ])
        W = self.accelerator.num_processes
        per_rank_batches = math.ceil(cfg.n_samples / cfg.micro_batch / W)
        total = cfg.epochs * math.ceil(per_rank_batches / cfg.accum)
        sched = torch.optim.lr_scheduler.LambdaLR(
            opt, lambda s: min(1.0, (s + 1) / (cfg.warmup * W)) * max(0.0, 1 - s / (total * W)))
        self.model, self.opt, self.loader, self.sched = self.accelerator.prepare(model, opt, loader, sched)
        self.loss_fn = nn.CrossEntropyLoss()

    def train_window(self, batch_list):
        with self.accelerator.accumulate(self.model):
            for x, y in batch_list:
                loss = self.loss_fn(self.model(x), y) / len(batch_list)
                self.accelerator.backward(loss)
            self.opt.step()
            self.sched.step()
            self.opt.zero_grad()

    def fit(self):
        for _ in range(self.cfg.epochs):
            for chunk in windows(self.loader, self.cfg.accum):
                self.train_window(chunk)

    def final_hash(self):
        net = self.accelerator.unwrap_model(self.model)
        h = hashlib.sha256()
        for _, p in net.named_parameters():
            h.update(p.detach().float().contiguous().cpu().numpy().tobytes())
        if self.accelerator.is_main_process:
            print("FINAL_SHA256", h.hexdigest(), flush=True)
            torch.save({n: p.detach().float().clone() for n, p in net.named_parameters()},
                       os.path.join("tmp_scratch", os.path.basename(__file__) + ".params.pt"))


if __name__ == "__main__":
    r = Runner(RunConfig())
    r.fit()
    r.final_hash()
    r.accelerator.end_training()
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
