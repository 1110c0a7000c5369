# corpus: style=ddp class=OK
"""The fixed twin of bug_post_accumulate_hook_scales_running_sum: a tensor hook divides each
backward's own gradient by K; a post-accumulate hook that only reads the sum, and one that
clips it (a factor that is not K: not this rule's)."""
import torch
import torch.nn.functional as F


class Trainer:
    def __init__(self, model, k):
        self.model, self.k = model, k
        self.opt = torch.optim.SGD(model.parameters(), lr=0.1)
        self.norms = []
        for p in self.model.module.parameters():
            p.register_hook(lambda g: g / self.k)
            p.register_post_accumulate_grad_hook(self._log_norm)

    def _log_norm(self, param):
        self.norms.append(float(param.grad.norm()))

    def clip_(self, param, max_norm=1.0):
        n = param.grad.norm()
        if n > max_norm:
            param.grad.mul_(max_norm / (n + 1e-6))

    def attach_clip(self):
        for p in self.model.parameters():
            p.register_post_accumulate_grad_hook(self.clip_)

    def fit(self, loader):
        for i, (x, y) in enumerate(loader):
            F.mse_loss(self.model(x), y).backward()
            if (i + 1) % self.k == 0:
                self.opt.step()
                self.opt.zero_grad()
        self.opt.zero_grad()
