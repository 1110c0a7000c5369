# corpus: style=trainer_class class=F1
import torch


class Runner:
    def __init__(self, model, opt, accumulation=8):
        self.model, self.opt, self.accumulation = model, opt, accumulation
        self.updates = 0

    def _apply(self):
        self.opt.step()  # expect: AG101
        self.opt.zero_grad()

    def _update(self):
        self._apply()
        self.updates += 1

    def run(self, batches):
        for x, y in batches:
            out = self.model(x)
            loss = torch.nn.functional.mse_loss(out, y) / self.accumulation
            loss.backward()
            self._update()
