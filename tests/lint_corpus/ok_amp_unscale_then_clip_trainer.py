# corpus: style=trainer_class class=OK
from torch.amp import GradScaler
from torch.nn.utils import clip_grad_value_


class Trainer:
    def __init__(self, model, optimizer, accum_steps, clip_value):
        self.model, self.optimizer = model, optimizer
        self.accum_steps, self.clip_value = accum_steps, clip_value
        self.scaler = GradScaler("cuda")

    def fit(self, loader):
        for step, (x, y) in enumerate(loader):
            loss = self.model(x, y) / self.accum_steps
            self.scaler.scale(loss).backward()
            if (step + 1) % self.accum_steps == 0:
                self.scaler.unscale_(self.optimizer)
                clip_grad_value_(self.model.parameters(), self.clip_value)
                self.scaler.step(self.optimizer)
                self.scaler.update()
                self.optimizer.zero_grad()
