# corpus: style=trainer_class class=F1
import torch


class Trainer:
    def __init__(self, model, cfg) -> None:
        self.model = model
        self.grad_accumulation_steps = cfg.grad_accumulation_steps
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
        self.lr_scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(self.optimizer, T_max=cfg.steps)

    def train_epoch(self, loader) -> float:
        total = 0.0
        for batch in loader:
            loss = self.model(batch) / self.grad_accumulation_steps
            loss.backward()
            total += loss.item()
            self.optimizer.step()  # expect: AG101
            self.lr_scheduler.step()
            self.optimizer.zero_grad()
        return total
