# corpus: style=trainer_class class=F1
class Engine:
    def __init__(self, model, optimizer, micro_batches):
        self.model, self.optimizer, self.micro_batches = model, optimizer, micro_batches

    def run(self, loader):
        for batch in loader:
            loss = self.model(batch) / self.micro_batches
            loss.backward()
            self.optimizer.step()  # expect: AG101
            self.optimizer.zero_grad()
