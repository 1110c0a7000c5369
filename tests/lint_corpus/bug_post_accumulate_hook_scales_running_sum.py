# corpus: style=ddp class=LOSS_SCALE
"""A DDP trainer applying 1/K through register_post_accumulate_grad_hook: the hook scales the
accumulated .grad after every backward (blind round 127 a_b01)."""
import torch
import torch.nn.functional as F


class Trainer:
    def __init__(self, model, k):
        self.model, self.k = model, k
        self.opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for p in self.model.module.parameters():
            p.register_post_accumulate_grad_hook(self._scale_grad)  # expect: AG354

    def _scale_grad(self, param):
        param.grad.div_(self.k)

    def fit(self, loader):
        for i, (x, y) in enumerate(loader):
            F.mse_loss(self.model(x), y).backward()
            if (i + 1) % self.k == 0:
                self.opt.step()
                self.opt.zero_grad()
        self.opt.zero_grad()
