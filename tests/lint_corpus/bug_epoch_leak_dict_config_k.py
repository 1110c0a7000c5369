# corpus: style=config_dict class=F7
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

CONFIG = {
    "epochs": 3,
    "batch_size": 8,
    "grad_accum": 4,
    "lr": 3e-4,
}


def train():
    model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 5))
    ds = TensorDataset(torch.randn(200, 20), torch.randint(0, 5, (200,)))
    loader = DataLoader(ds, batch_size=CONFIG["batch_size"], shuffle=True)
    opt = torch.optim.AdamW(model.parameters(), lr=CONFIG["lr"])
    for epoch in range(CONFIG["epochs"]):
        for it, (x, y) in enumerate(loader):
            loss = nn.functional.cross_entropy(model(x), y) / CONFIG["grad_accum"]
            loss.backward()
            if (it + 1) % CONFIG["grad_accum"] == 0:  # expect: AG117
                opt.step()
                opt.zero_grad()


if __name__ == "__main__":
    train()
