# corpus: style=trainer_class class=F13
# enumerate(..., start=1) already makes the count 1-based: `step % K == 1` fires on the first
# micro-batch (a window of 1), then on every K-th, so each boundary is one micro-batch early
import torch
import torch.nn.functional as F


class Trainer:
    def __init__(self, model, loader, lr=3e-4):
        self.model = model
        self.loader = loader
        self.accum_steps = 4
        self.optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)

    def fit(self):
        self.model.train()
        for step, (x, y) in enumerate(self.loader, start=1):
            loss = F.cross_entropy(self.model(x), y) / self.accum_steps
            loss.backward()
            if step % self.accum_steps == 1:  # expect: AG115
                self.optimizer.step()
                self.optimizer.zero_grad()
