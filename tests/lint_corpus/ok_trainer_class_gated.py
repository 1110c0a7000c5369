# corpus: style=trainer_class class=OK
# right when every pass holds a multiple of K micro-batches; the predicate method is read,
# so AG117 warns that a pass's tail would leak into the next one otherwise
import torch


class Trainer:
    def __init__(self, model, cfg):
        self.model = model
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
        self.scheduler = torch.optim.lr_scheduler.OneCycleLR(self.optimizer, cfg.lr, total_steps=cfg.steps)
        self.grad_accum = cfg.grad_accum

    def train_epoch(self, loader):
        for i, batch in enumerate(loader):
            loss = self.model(batch) / self.grad_accum
            loss.backward()
            if self._should_step(i):  # expect: AG117
                self.optimizer.step()
                self.scheduler.step()
                self.optimizer.zero_grad()

    def _should_step(self, i):
        return (i + 1) % self.grad_accum == 0
