# corpus: style=trainer_class class=F3
# the backward helper calls a second helper that clears the gradients on every micro-batch
import torch


class Runner:
    def __init__(self, model, loader, accum_steps):
        self.model = model
        self.loader = loader
        self.accum_steps = accum_steps
        self.opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def _reset(self):
        self.opt.zero_grad(set_to_none=True)  # expect: AG102

    def _forward_backward(self, batch):
        self._reset()
        loss = self.model(batch).mean() / self.accum_steps
        loss.backward()
        return loss.item()

    def train(self):
        for it, batch in enumerate(self.loader):
            self._forward_backward(batch)
            if (it + 1) % self.accum_steps == 0:
                self.opt.step()
