# corpus: style=trainer_class class=OK
import torch


class Trainer:
    """Class-based trainer with a derived boundary flag. Correct when the loader's length is
    a multiple of K; its length is not in sight, so the tail the flag also steps, divided by
    K, is AG141's warning."""

    def __init__(self, model, optimizer, scheduler, accum_steps: int) -> None:
        self.model = model
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.accum_steps = accum_steps
        self.global_step = 0

    def fit(self, loader) -> None:
        self.model.train()
        n = len(loader)
        for idx, batch in enumerate(loader):
            should_step = (idx + 1) % self.accum_steps == 0 or idx + 1 == n
            loss = self.model(batch).mean() / self.accum_steps  # expect: AG141
            loss.backward()
            if not should_step:
                continue
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
            self.optimizer.step()
            self.scheduler.step()
            self.optimizer.zero_grad(set_to_none=True)
            self.global_step += 1
