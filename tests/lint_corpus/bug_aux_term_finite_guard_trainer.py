# corpus: style=trainer_class class=LOSS_SCALE
import torch


class Trainer:
    def __init__(self, model, optimizer, grad_accum, entropy_weight):
        self.model, self.optimizer = model, optimizer
        self.grad_accum, self.entropy_weight = grad_accum, entropy_weight
        self.skipped = 0

    def train_epoch(self, loader):
        for step, batch in enumerate(loader, start=1):
            out = self.model(**batch)
            lm = out.loss / self.grad_accum
            loss = lm + self.entropy_weight * out.router_entropy  # expect: AG127
            if torch.isfinite(loss):
                loss.backward()
            else:
                self.skipped += 1
            if step % self.grad_accum == 0:  # expect: AG117
                self.optimizer.step()
                self.optimizer.zero_grad()
