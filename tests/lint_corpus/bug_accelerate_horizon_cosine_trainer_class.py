# corpus: style=accelerate class=F4
# a trainer class: Accelerator with K = 8 from its config, a cosine schedule over
# epochs * len(loader) micro-batches stepped inside accelerator.accumulate: 8 x too long
from dataclasses import dataclass

import torch
from accelerate import Accelerator
from transformers import get_cosine_schedule_with_warmup


@dataclass
class Cfg:
    grad_accum: int = 8
    epochs: int = 2
    warmup: int = 100


class Runner:
    def __init__(self, model, loader, cfg: Cfg):
        self.cfg = cfg
        self.acc = Accelerator(gradient_accumulation_steps=cfg.grad_accum)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        total = cfg.epochs * len(loader)
        sched = get_cosine_schedule_with_warmup(opt, cfg.warmup, total)  # expect: AG124
        self.model, self.opt, self.loader, self.sched = self.acc.prepare(model, opt, loader, sched)

    def fit(self):
        for _ in range(self.cfg.epochs):
            for batch in self.loader:
                with self.acc.accumulate(self.model):
                    loss = self.model(**batch).loss
                    self.acc.backward(loss)
                    self.opt.step()
                    self.sched.step()
                    self.opt.zero_grad()
