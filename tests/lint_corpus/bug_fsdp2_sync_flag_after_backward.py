# corpus: style=fsdp2 class=F11
# The sync flag for the micro-step is set after its backward: FSDP2 reads it when a backward
# runs, so it decides the next micro-step's, and the window's last backward never syncs.
import torch.nn.functional as F


class Trainer:
    def __init__(self, model, opt, accum=4):
        self.model, self.opt, self.accum = model, opt, accum

    def micro_step(self, x, y, micro):
        loss = F.mse_loss(self.model(x), y) / self.accum
        loss.backward()
        self.model.set_requires_gradient_sync(micro == self.accum - 1)  # expect: AG106
        return loss.detach()

    def fit(self, batches):
        for window in batches:
            for micro, (x, y) in enumerate(window):
                self.micro_step(x, y, micro)
            self.opt.step()
            self.opt.zero_grad()
