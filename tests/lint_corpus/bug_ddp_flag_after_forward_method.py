# corpus: style=trainer_class class=F11
# A trainer whose boundary helper is consulted between forward and backward.
from torch.nn.parallel import DistributedDataParallel as DDP


class Runner:
    def __init__(self, model, optimizer, grad_accum_steps):
        self.model = DDP(model)
        self.optimizer = optimizer
        self.grad_accum_steps = grad_accum_steps

    def is_sync_step(self, step):
        return (step + 1) % self.grad_accum_steps == 0

    def train(self, loader):
        for step, batch in enumerate(loader):
            out = self.model(batch["input_ids"], labels=batch["labels"])
            self.model.require_backward_grad_sync = self.is_sync_step(step)  # expect: AG106
            (out.loss / self.grad_accum_steps).backward()
            if self.is_sync_step(step):
                self.optimizer.step()
                self.optimizer.zero_grad()
