# corpus: style=trainer_class class=F4
import torch


class Trainer:
    def __init__(self, model, loader, epochs=3, grad_accum_steps=8):
        self.model, self.loader, self.epochs = model, loader, epochs
        self.grad_accum_steps = grad_accum_steps
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
        self.scheduler = torch.optim.lr_scheduler.OneCycleLR(  # expect: AG124
            self.optimizer, max_lr=3e-4, total_steps=self.epochs * len(self.loader)
        )

    def fit(self):
        for epoch in range(self.epochs):
            for step, batch in enumerate(self.loader):
                loss = self.model(**batch).loss / self.grad_accum_steps
                loss.backward()
                if (step + 1) % self.grad_accum_steps == 0:  # expect: AG117
                    self.optimizer.step()
                    self.scheduler.step()
                    self.optimizer.zero_grad()
