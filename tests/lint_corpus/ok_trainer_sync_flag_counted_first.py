# corpus: style=trainer_class class=OK
class Runner:
    def __init__(self, model, optimizer, grad_accum):
        self.model, self.optimizer, self.grad_accum = model, optimizer, grad_accum
        self.micro = 0

    def epoch(self, loader, loss_fn):
        for batch in loader:
            self.micro += 1
            should_step = self.micro % self.grad_accum == 0
            self.model.require_backward_grad_sync = should_step
            loss = loss_fn(self.model(batch["x"]), batch["y"]) / self.grad_accum
            loss.backward()
            if should_step:
                self.optimizer.step()
                self.optimizer.zero_grad()
