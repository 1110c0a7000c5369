# corpus: style=trainer_class class=LOSS_SCALE
# the loop lives in train(); the per-micro-batch method backwards the model's mean loss as is
import torch


class MyTrainer:
    def __init__(self, model, loader, grad_accum=8):
        self.model = model
        self.loader = loader
        self.K = grad_accum
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def train(self):
        for epoch in range(3):
            for i, b in enumerate(self.loader):
                self.micro_step(b, i)

    def micro_step(self, b, i):
        loss = self.model(**b).loss
        loss.backward()  # expect: AG122
        if (i + 1) % self.K == 0:
            self.optimizer.step()
            self.optimizer.zero_grad()
