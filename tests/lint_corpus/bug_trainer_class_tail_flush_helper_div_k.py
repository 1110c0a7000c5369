# corpus: style=trainer_class class=F7
# the epoch's last partial window is flushed through the trainer's step helper, but every
# micro-batch's loss is still divided by K: the tail's update is shrunk by r/K
import torch


class Trainer:
    def __init__(self, model, loader, accum_steps):
        self.model, self.loader, self.K = model, loader, accum_steps
        self.optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    def _optimizer_step(self):
        self.optimizer.step()
        self.optimizer.zero_grad()

    def train(self, epochs):
        n = len(self.loader)
        for _ in range(epochs):
            for i, (x, y) in enumerate(self.loader):
                loss = torch.nn.functional.mse_loss(self.model(x), y) / self.K  # expect: AG141
                loss.backward()
                if (i + 1) % self.K == 0 or (i + 1) == n:
                    self._optimizer_step()


Trainer(model, loader, accum_steps=7).train(epochs=2)
