# corpus: style=trainer_class class=F3
class Trainer:
    def __init__(self, model, optimizer, accumulation_steps=4):
        self.model = model
        self.optimizer = optimizer
        self.accumulation_steps = accumulation_steps

    def _backward(self, loss):
        self.model.zero_grad()  # expect: AG102
        (loss / self.accumulation_steps).backward()

    def fit(self, loader):
        for i, batch in enumerate(loader):
            loss = self.model(**batch).loss
            self._backward(loss)
            if (i + 1) % self.accumulation_steps == 0:
                self.optimizer.step()
                self.optimizer.zero_grad()
