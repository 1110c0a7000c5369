# corpus: style=trainer_class class=OK
class Trainer:
    def __init__(self, model, optimizer, grad_accum_steps):
        self.model, self.optimizer, self.grad_accum_steps = model, optimizer, grad_accum_steps

    def fit(self, loader):
        for i, batch in enumerate(loader):
            out = self.model(**batch)
            loss = (out.loss + 0.001 * out.z_loss) / self.grad_accum_steps
            loss = loss + 0.01 * out.aux_loss / self.grad_accum_steps
            loss.backward()
            if (i + 1) % self.grad_accum_steps == 0:
                self.optimizer.step()
                self.optimizer.zero_grad()
