# corpus: style=class_trainer class=F4
# a LambdaLR sized in micro-batches, stepped in a helper the window calls at its boundary
import torch


class Trainer:
    def __init__(self, model, loader, grad_accum, epochs):
        self.model, self.loader, self.grad_accum, self.epochs = model, loader, grad_accum, epochs
        self.opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        self.total = self.epochs * len(self.loader)
        self.sched = torch.optim.lr_scheduler.LambdaLR(  # expect: AG124
            self.opt, lambda s: max(0.0, 1 - s / self.total))

    def _optimizer_step(self):
        self.opt.step()
        self.sched.step()
        self.opt.zero_grad(set_to_none=True)

    def train(self):
        for epoch in range(self.epochs):
            for i, (x, y) in enumerate(self.loader):
                (torch.nn.functional.cross_entropy(self.model(x), y) / self.grad_accum).backward()
                if (i + 1) % self.grad_accum == 0:  # expect: AG117
                    self._optimizer_step()
