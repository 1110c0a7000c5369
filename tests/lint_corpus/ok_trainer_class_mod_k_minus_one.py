# corpus: style=trainer_class class=OK
# the same trainer tested on the 0-based count with `== K - 1`: windows of exactly K
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
        for step, (x, y) in enumerate(self.loader):
            loss = F.cross_entropy(self.model(x), y) / self.accum_steps
            loss.backward()
            if step % self.accum_steps == self.accum_steps - 1:
                self.optimizer.step()
                self.optimizer.zero_grad()
