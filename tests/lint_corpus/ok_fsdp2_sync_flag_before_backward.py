# corpus: style=fsdp2 class=OK
# The sync flag for the micro-step is set before its forward and backward: the window's last
# backward reduce-scatters.
import torch.nn.functional as F


class Trainer:
    def __init__(self, model, opt, accum=4):
        self.model, self.opt, self.accum = model, opt, accum

    def micro_step(self, x, y, micro):
        self.model.set_requires_gradient_sync(micro == self.accum - 1)
        loss = F.mse_loss(self.model(x), y) / self.accum
        loss.backward()
        return loss.detach()

    def fit(self, batches):
        for window in batches:
            for micro, (x, y) in enumerate(window):
                self.micro_step(x, y, micro)
            self.opt.step()
            self.opt.zero_grad()
