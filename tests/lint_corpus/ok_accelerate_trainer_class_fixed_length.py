# corpus: style=trainer_class class=OK
# fixed-size regression targets, no padding: every micro-batch mean has the same weight, and
# accelerator.backward's 1/K makes the window mean
import torch.nn as nn
from accelerate import Accelerator


class Regressor:
    def __init__(self, model, optimizer, loader, accum=4):
        self.accelerator = Accelerator(gradient_accumulation_steps=accum)
        self.model, self.optimizer, self.loader = self.accelerator.prepare(model, optimizer, loader)
        self.criterion = nn.MSELoss()

    def train_epoch(self):
        for x, y in self.loader:
            with self.accelerator.accumulate(self.model):
                loss = self.criterion(self.model(x), y)
                self.accelerator.backward(loss)
                self.optimizer.step()
                self.optimizer.zero_grad()
