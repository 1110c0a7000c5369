# corpus: style=trainer class=OK
"""An in-house trainer: the base class's training_step was written for one micro-batch per
step; the subclass adds accumulation by calling it for every micro-batch of a window."""
import itertools

import torch
import torch.nn.functional as F


class Trainer:
    def __init__(self, model, lr, k):
        self.model = model
        self.k = k
        self.opt = torch.optim.AdamW(model.parameters(), lr=lr)
        self.steps = 0

    def training_step(self, x, y, n_window):
        loss = F.mse_loss(self.model(x), y, reduction="sum") / n_window
        loss.backward()
        return loss.detach()

    def optimizer_step(self):
        self.opt.step()
        self.opt.zero_grad()
        self.steps += 1


class AccumulatingTrainer(Trainer):
    def fit(self, loader, max_steps):
        batches = iter(loader)
        while self.steps < max_steps:
            window = list(itertools.islice(batches, self.k))
            n_window = sum(len(x) for x, _ in window)
            for x, y in window:
                self.training_step(x, y, n_window)
            self.optimizer_step()
