# corpus: style=trainer class=F11
# the sync helper answers for the window's first micro-step, the step for its last: the last
# micro-batch's backward runs under no_sync and the window is never all-reduced whole
import contextlib


class Learner:
    def __init__(self, model, optimizer, accum_steps):
        self.model, self.optimizer, self.accum_steps = model, optimizer, accum_steps

    def syncs(self, micro):
        return micro % self.accum_steps == 0

    def update(self, batches):
        for micro, (x, y) in enumerate(batches):
            ctx = contextlib.nullcontext() if self.syncs(micro) else self.model.no_sync()  # expect: AG111
            with ctx:
                loss = self.model(x, y) / self.accum_steps
                loss.backward()
            if (micro + 1) % self.accum_steps == 0:
                self.optimizer.step()
                self.optimizer.zero_grad()
