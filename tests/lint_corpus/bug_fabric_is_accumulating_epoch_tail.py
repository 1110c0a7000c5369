# corpus: style=fabric class=F7
import torch
from lightning.fabric import Fabric
from torch.utils.data import DataLoader, TensorDataset

K = 4


def main():
    fabric = Fabric(accelerator="cpu", devices=2, strategy="ddp")
    fabric.launch()
    model = torch.nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    model, optimizer = fabric.setup(model, optimizer)
    data = TensorDataset(torch.randn(40, 8), torch.randn(40, 1))
    loader = fabric.setup_dataloaders(DataLoader(data, batch_size=2))
    for _ in range(3):
        for batch_idx, (x, y) in enumerate(loader):
            is_accumulating = (batch_idx + 1) % K != 0
            with fabric.no_backward_sync(model, enabled=is_accumulating):
                fabric.backward(torch.nn.functional.mse_loss(model(x), y) / K)
            if not is_accumulating:  # expect: AG117
                optimizer.step()
                optimizer.zero_grad()


if __name__ == "__main__":
    main()
