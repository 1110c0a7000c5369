# corpus: style=mingpt class=F4
"""minGPT's token-driven learning rate on DDP: each rank adds its own tokens, while
final_tokens counts the whole dataset the DistributedSampler splits."""
import math

import torch
from torch.utils.data import DataLoader, DistributedSampler


class Trainer:
    def __init__(self, model, dataset, cfg):
        self.model, self.dataset, self.cfg = model, dataset, cfg
        self.opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
        self.seen_tokens = 0

    def update_lr(self, y):
        self.seen_tokens += int((y >= 0).sum())  # expect: AG175
        progress = min(1.0, self.seen_tokens / self.cfg.total_tokens)
        for g in self.opt.param_groups:
            g["lr"] = self.cfg.lr * 0.5 * (1.0 + math.cos(math.pi * progress))

    def fit(self):
        loader = DataLoader(self.dataset, batch_size=self.cfg.batch_size,
                            sampler=DistributedSampler(self.dataset))
        for i, (x, y) in enumerate(loader):
            loss = self.model(x, y) / self.cfg.accum
            loss.backward()
            self.update_lr(y)
            if (i + 1) % self.cfg.accum == 0:
                self.opt.step()
                self.opt.zero_grad()


cfg = make_config()
cfg.total_tokens = cfg.epochs * len(train_set) * cfg.block_size
Trainer(build_model(), train_set, cfg).fit()
