# corpus: style=trainer class=F4
import torch
import torch.nn.functional as F


class Trainer:
    def __init__(self, model, loader, accumulation_steps=4):
        self.model, self.loader = model, loader
        self.accumulation_steps = accumulation_steps
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        self.lr_scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda s: min(1.0, (s + 1) / 10))

    def _backward(self, loss):
        loss.backward()

    def _training_step(self, x, y):
        loss = F.mse_loss(self.model(x), y) / self.accumulation_steps
        self._backward(loss)
        self.lr_scheduler.step()  # expect: AG103
        return loss.detach()

    def _optimizer_step(self):
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def train_epoch(self):
        for i, (x, y) in enumerate(self.loader):
            self._training_step(x, y)
            if (i + 1) % self.accumulation_steps == 0:  # expect: AG117
                self._optimizer_step()
