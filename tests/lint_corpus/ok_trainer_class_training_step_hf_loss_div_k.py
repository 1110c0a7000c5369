# corpus: style=trainer_class class=OK
# a hand loop: the HF model's mean loss divided by K, stepped at the boundary (fixed-length batches)
import torch


class MyTrainer:
    def __init__(self, model, loader, grad_accum=8):
        self.model = model
        self.loader = loader
        self.K = grad_accum
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda s: 1.0)

    def train(self):
        for i, b in enumerate(self.loader):
            self.training_step(b, i)

    def training_step(self, b, i):
        loss = self.model(**b).loss / self.K
        loss.backward()
        if (i + 1) % self.K == 0:
            self.optimizer.step()
            self.scheduler.step()
            self.optimizer.zero_grad()
