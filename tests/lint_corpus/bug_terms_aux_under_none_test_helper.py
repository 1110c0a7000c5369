# corpus: style=fsdp2 class=LOSS_SCALE
# a trainer's compute_loss divides the CE by K and adds the MoE balance term when the model
# returned one, undivided: that term weighs K times its coefficient
import torch.nn.functional as F


class Trainer:
    def __init__(self, model, opt, cfg):
        self.model, self.opt = model, opt
        self.accum = cfg["accum"]
        self.aux_coef = cfg["aux_coef"]

    def compute_loss(self, xb, yb):
        logits, aux = self.model(xb)
        ce = F.cross_entropy(logits, yb)
        loss = ce / self.accum
        if aux is not None:
            loss = loss + self.aux_coef * aux  # expect: AG127
        return loss, ce.detach()

    def train(self, batches, updates):
        it = iter(batches)
        for _ in range(updates):
            for k in range(self.accum):
                self.model.set_requires_gradient_sync(k == self.accum - 1)
                xb, yb = next(it)
                loss, _ = self.compute_loss(xb, yb)
                loss.backward()
            self.opt.step()
            self.opt.zero_grad()
