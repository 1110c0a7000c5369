# corpus: style=trainer class=OK
# SGDR stepped once per update with the fraction of the epoch done, both counts in
# micro-batches: correct
import torch


class Trainer:
    def __init__(self, model, loader, accum_steps):
        self.model, self.loader, self.accum_steps = model, loader, accum_steps
        self.opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        self.sched = torch.optim.lr_scheduler.CosineAnnealingWarmRestarts(self.opt, T_0=2)

    def fit(self, epochs):
        updates_per_epoch = len(self.loader) // self.accum_steps
        for epoch in range(epochs):
            seen = 0
            for x, y in self.loader:
                loss = self.model(x, y) / self.accum_steps
                loss.backward()
                seen += 1
                if seen % self.accum_steps == 0:
                    self.opt.step()
                    self.opt.zero_grad()
                    self.sched.step(epoch + seen // self.accum_steps / updates_per_epoch)
            self.opt.zero_grad()  # a partial window at the epoch end is dropped
