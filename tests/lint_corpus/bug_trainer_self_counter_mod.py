# corpus: style=trainer_class class=F13
import torch


class SimpleTrainer:
    def __init__(self, model, lr, accum_steps):
        self.model = model
        self.optimizer = torch.optim.SGD(model.parameters(), lr=lr)
        self.accum_steps = accum_steps
        self.micro_step = 0

    def train_epoch(self, loader):
        for batch in loader:
            loss = self.model(batch).mean() / self.accum_steps
            loss.backward()
            if self.micro_step % self.accum_steps == 0:  # expect: AG115
                self.optimizer.step()
                self.optimizer.zero_grad()
            self.micro_step += 1
