# corpus: style=plain class=F7
import torch
from torch.utils.data import DataLoader, TensorDataset

N_SAMPLES = 36
MICRO_BS = 4
ACC = 4


def build_loader(shuffle=True):
    feats = torch.randn(N_SAMPLES, 12)
    target = torch.randn(N_SAMPLES, 1)
    return DataLoader(TensorDataset(feats, target), batch_size=MICRO_BS, shuffle=shuffle)


def train(model, opt, epochs=3):
    train_loader = build_loader()
    for ep in range(epochs):
        for step, (a, b) in enumerate(train_loader):
            ((model(a) - b).pow(2).mean() / ACC).backward()
            if (step + 1) % ACC == 0:  # expect: AG117
                opt.step()
                opt.zero_grad()
