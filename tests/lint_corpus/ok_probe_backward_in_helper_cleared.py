# corpus: style=class_trainer class=OK
# the same check clearing the gradient it made
import torch
import torch.nn.functional as F


class Trainer:
    def __init__(self, model, xs, ys, accum):
        self.model, self.xs, self.ys, self.accum = model, xs, ys, accum
        self.opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def check_gradient_flow(self):
        F.mse_loss(self.model(self.xs[0]), self.ys[0]).backward()
        dead = [n for n, p in self.model.named_parameters() if p.grad is None]
        if dead:
            raise RuntimeError(f"no gradient: {dead}")
        self.opt.zero_grad(set_to_none=True)

    def fit(self, steps):
        self.check_gradient_flow()
        for step in range(steps):
            for k in range(self.accum):
                i = step * self.accum + k
                (F.mse_loss(self.model(self.xs[i]), self.ys[i]) / self.accum).backward()
            self.opt.step()
            self.opt.zero_grad(set_to_none=True)
