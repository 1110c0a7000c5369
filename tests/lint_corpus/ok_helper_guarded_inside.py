# corpus: style=trainer_class class=OK
import torch


class Trainer:
    def __init__(self, model, optimizer, scheduler, grad_accum_steps):
        self.model, self.optimizer, self.scheduler = model, optimizer, scheduler
        self.grad_accum_steps = grad_accum_steps

    def backward_step(self, loss, step):
        (loss / self.grad_accum_steps).backward()
        if (step + 1) % self.grad_accum_steps == 0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
            self.optimizer.step()
            self.scheduler.step()
            self.optimizer.zero_grad()

    def train(self, loader):
        for step, batch in enumerate(loader):
            loss = self.model(**batch).loss
            self.backward_step(loss, step)
