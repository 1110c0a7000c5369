# corpus: style=trainer_class class=F4
# a trainer method: an inline linear warm-up from a counter bumped on every batch, while the
# step is taken every `grad_accum` batches; the warm-up length is not tied to the loop in
# sight (a warning: it may have been counted in batches on purpose)
import torch


class Trainer:
    def __init__(self, model, grad_accum=4, warmup_steps=500, base_lr=1e-3):
        self.model = model
        self.grad_accum = grad_accum
        self.warmup_steps = warmup_steps
        self.base_lr = base_lr
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=base_lr)

    def fit(self, loader):
        seen = 0
        for batch_idx, (x, y) in enumerate(loader):
            seen += 1
            loss = torch.nn.functional.cross_entropy(self.model(x), y) / self.grad_accum
            loss.backward()
            if (batch_idx + 1) % self.grad_accum == 0:
                for group in self.optimizer.param_groups:
                    group["lr"] = self.base_lr * min(1.0, seen / self.warmup_steps)  # expect: AG130
                self.optimizer.step()
                self.optimizer.zero_grad()
