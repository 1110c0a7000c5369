# corpus: style=trainer_class class=OK
import torch


class Runner:
    def __init__(self, model, opt, accumulation=8):
        self.model, self.opt, self.accumulation = model, opt, accumulation

    def _apply(self):
        self.opt.step()
        self.opt.zero_grad()

    def _update(self):
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self._apply()

    def run(self, batches):
        for n, (x, y) in enumerate(batches, start=1):
            loss = torch.nn.functional.mse_loss(self.model(x), y) / self.accumulation
            loss.backward()
            if n % self.accumulation == 0:
                self._update()
