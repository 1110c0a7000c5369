# corpus: style=trainer_class class=F4
# a trainer class: loaders prepared in __init__-like setup, the cosine T_max counted from the
# prepared loader's length divided by the accumulation steps, the scheduler prepared after
import torch
from accelerate import Accelerator


class Runner:
    def setup(self, model, train_dl, epochs=2, accumulation_steps=4):
        self.accelerator = Accelerator(gradient_accumulation_steps=accumulation_steps)
        opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
        self.model, self.opt, self.train_dl = self.accelerator.prepare(model, opt, train_dl)
        updates = epochs * (len(self.train_dl) // accumulation_steps)
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(self.opt, T_max=updates)  # expect: AG125
        self.sched = self.accelerator.prepare(sched)
        self.epochs = epochs

    def fit(self):
        for _ in range(self.epochs):
            for batch in self.train_dl:
                with self.accelerator.accumulate(self.model):
                    self.accelerator.backward(self.model(batch).mean())
                    self.opt.step()
                    self.sched.step()
                    self.opt.zero_grad()
