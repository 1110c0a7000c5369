# corpus: style=trainer_class class=F4
import torch


class Runner:
    def __init__(self, model, accumulation_steps):
        self.model = model
        self.accumulation_steps = accumulation_steps
        self.optim = torch.optim.SGD(model.parameters(), lr=0.1)
        self.sched = torch.optim.lr_scheduler.StepLR(self.optim, step_size=30)

    def fit(self, loader):
        for i, (x, y) in enumerate(loader):
            loss = self.model.loss(x, y) / self.accumulation_steps
            loss.backward()
            if (i + 1) % self.accumulation_steps == 0:
                self.optim.step()
                self.optim.zero_grad()
            self.sched.step()  # expect: AG103
