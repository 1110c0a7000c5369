# corpus: style=trainer_class class=OK
# the clearing helper runs before the loop and after each step, never inside a window
import torch


class Runner:
    def __init__(self, model, loader, accum_steps):
        self.model = model
        self.loader = loader
        self.accum_steps = accum_steps
        self.opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def _reset(self):
        self.opt.zero_grad(set_to_none=True)

    def _forward_backward(self, batch):
        loss = self.model(batch).mean() / self.accum_steps
        loss.backward()
        return loss.item()

    def train(self):
        self._reset()
        for it, batch in enumerate(self.loader):
            self._forward_backward(batch)
            if (it + 1) % self.accum_steps == 0:
                self.opt.step()
                self._reset()
