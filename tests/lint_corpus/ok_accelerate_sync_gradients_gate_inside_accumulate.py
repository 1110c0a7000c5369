# corpus: style=accelerate class=OK
# The same runner with each micro-step inside `accumulate()`: `sync_gradients` is True only
# at the window's last batch, and the gate steps once per window.
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
        self.opt.step()
        self.opt.zero_grad()

    def train(self):
        for batch in self.loader:
            with self.accelerator.accumulate(self.model):
                self._forward_backward(batch)
                if self.accelerator.sync_gradients:
                    self._optimizer_step()
