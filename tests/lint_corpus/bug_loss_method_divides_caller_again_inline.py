# corpus: style=trainer_class class=LOSS_SCALE
import torch
import torch.nn as nn


class LMTrainer:
    def __init__(self, model, accum_steps=8):
        self.model = model
        self.accum_steps = accum_steps
        self.opt = torch.optim.SGD(model.parameters(), lr=0.1)
        self.crit = nn.CrossEntropyLoss()

    def compute_loss(self, batch):
        logits = self.model(batch["input"])
        loss = self.crit(logits.flatten(0, 1), batch["target"].flatten())
        loss /= self.accum_steps
        return loss

    def train(self, loader):
        for i, batch in enumerate(loader):
            (self.compute_loss(batch) / self.accum_steps).backward()  # expect: AG133
            if (i + 1) % self.accum_steps == 0:
                self.opt.step()
                self.opt.zero_grad()
