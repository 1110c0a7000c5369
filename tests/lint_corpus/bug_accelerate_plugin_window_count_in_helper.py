# corpus: style=accelerate class=LOSS_SCALE
# K set through a GradientAccumulationPlugin; a helper normalises each micro-step's token sum
# by the window's all-rank count (x W) and accelerator.backward divides by K again: G / K
import torch.nn.functional as F
from accelerate import Accelerator
from accelerate.utils import GradientAccumulationPlugin


class Trainer:
    def __init__(self, model, opt, loader, k):
        self.accelerator = Accelerator(
            gradient_accumulation_plugin=GradientAccumulationPlugin(num_steps=k, sync_with_dataloader=False))
        self.model, self.opt, self.loader = self.accelerator.prepare(model, opt, loader)
        self.k = k

    def window_tokens(self, window):
        n = sum((labels != -100).sum() for _, labels in window)
        return self.accelerator.gather(n.reshape(1)).sum()

    def micro_step(self, ids, labels, n_window):
        with self.accelerator.accumulate(self.model):
            tok_sum = F.cross_entropy(self.model(ids).flatten(0, 1), labels.flatten(), reduction="sum")
            loss = tok_sum * self.accelerator.num_processes / n_window  # expect: AG121
            self.accelerator.backward(loss)
            self.opt.step()
            self.opt.zero_grad()

    def fit(self):
        it = iter(self.loader)
        for _ in range(len(self.loader) // self.k):
            window = [next(it) for _ in range(self.k)]
            n_window = self.window_tokens(window)
            for ids, labels in window:
                self.micro_step(ids, labels, n_window)
