# corpus: style=trainer class=OK
# the sync helper answers for the window's last micro-step, where the step is
import contextlib


class Learner:
    def __init__(self, model, optimizer, accum_steps):
        self.model, self.optimizer, self.accum_steps = model, optimizer, accum_steps

    def syncs(self, micro):
        return (micro + 1) % self.accum_steps == 0

    def update(self, batches):
        for micro, (x, y) in enumerate(batches):
            ctx = contextlib.nullcontext() if self.syncs(micro) else self.model.no_sync()
            with ctx:
                loss = self.model(x, y) / self.accum_steps
                loss.backward()
            if (micro + 1) % self.accum_steps == 0:
                self.optimizer.step()
                self.optimizer.zero_grad()
