# corpus: style=trainer_class class=OK
from dataclasses import dataclass

import torch


@dataclass
class Config:
    accumulate: int = 4
    lr: float = 3e-4


class GatedOptimizer:
    def __init__(self, optimizer, every=1):
        self.optimizer = optimizer
        self.every = every
        self.calls = 0
        self.ready = False

    def step(self):
        self.calls += 1
        self.ready = self.calls % self.every == 0
        if self.ready:
            self.optimizer.step()

    def zero_grad(self):
        if self.ready:
            self.optimizer.zero_grad(set_to_none=True)


def make_optimizer(model, cfg):
    inner = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
    return GatedOptimizer(inner, every=cfg.accumulate)


class Runner:
    def __init__(self, model, cfg):
        self.model, self.cfg = model, cfg
        self.opt = make_optimizer(model, cfg)

    def run(self, loader):
        for x, y in loader:
            loss = torch.nn.functional.cross_entropy(self.model(x), y) / self.cfg.accumulate
            loss.backward()
            self.opt.step()
            self.opt.zero_grad()
