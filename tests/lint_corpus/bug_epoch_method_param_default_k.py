# corpus: style=trainer_class class=F7
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


class Trainer:
    def __init__(self, model, lr=0.05):
        self.model = model
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
        self.criterion = nn.CrossEntropyLoss()

    def train_epoch(self, loader, grad_accum=3):
        self.model.train()
        for step, (x, y) in enumerate(loader):
            loss = self.criterion(self.model(x), y) / grad_accum
            loss.backward()
            if (step + 1) % grad_accum == 0:  # expect: AG117
                self.optimizer.step()
                self.optimizer.zero_grad(set_to_none=True)

    def fit(self, epochs):
        data = TensorDataset(torch.randn(40, 12), torch.randint(0, 3, (40,)))
        loader = DataLoader(data, batch_size=4, shuffle=True)
        for _ in range(epochs):
            self.train_epoch(loader)


if __name__ == "__main__":
    Trainer(nn.Linear(12, 3)).fit(epochs=3)
