# corpus: style=trainer_class class=OK
"""The window's micro-steps run in a list comprehension; a helper called after it steps once
per window."""
import torch


class Trainer:
    def __init__(self, model, accum):
        self.model, self.accum = model, accum
        self.opt = torch.optim.Adam(model.parameters(), lr=1e-4)

    def micro_step(self, batch):
        loss = self.model(batch).mean() / self.accum
        loss.backward()
        return loss.item()

    def optimizer_step(self):
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)

    def train(self, batches, updates):
        for update in range(updates):
            losses = [self.micro_step(next(batches)) for _ in range(self.accum)]
            self.optimizer_step()
            print(update, sum(losses))
