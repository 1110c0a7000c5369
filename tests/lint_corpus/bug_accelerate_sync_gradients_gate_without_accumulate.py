# corpus: style=accelerate class=F1
# The step is gated by `accelerator.sync_gradients`, but no `accumulate()` block is entered:
# the flag stays True, so the gate is always open and the optimizer steps on every batch.
import torch
import torch.nn.functional as F
from accelerate import Accelerator


class Runner:
    def __init__(self, model, loader, grad_accum=4):
        self.accelerator = Accelerator(cpu=True, gradient_accumulation_steps=grad_accum)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        self.model, self.opt, self.loader = self.accelerator.prepare(model, opt, loader)

    def _forward_backward(self, batch):
        x, y = batch
        with self.accelerator.autocast():
            loss = F.cross_entropy(self.model(x), y)
        self.accelerator.backward(loss)

    def _optimizer_step(self):
        self.opt.step()  # expect: AG128
        self.opt.zero_grad()

    def train(self):
        for batch in self.loader:
            self._forward_backward(batch)
            if self.accelerator.sync_gradients:
                self._optimizer_step()
