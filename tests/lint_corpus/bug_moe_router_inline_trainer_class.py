# corpus: style=trainer_class class=LOSS_SCALE
import torch


class MoETrainer:
    def __init__(self, model, optimizer, grad_accum_steps=4, router_aux_coef=0.01):
        self.model, self.optimizer = model, optimizer
        self.grad_accum_steps = grad_accum_steps
        self.router_aux_coef = router_aux_coef

    def train_epoch(self, loader):
        for step, batch in enumerate(loader):
            out = self.model(**batch)
            loss = out.loss / self.grad_accum_steps + self.router_aux_coef * out.aux_loss  # expect: AG127
            loss.backward()
            if (step + 1) % self.grad_accum_steps == 0:  # expect: AG117
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
                self.optimizer.step()
                self.optimizer.zero_grad()
