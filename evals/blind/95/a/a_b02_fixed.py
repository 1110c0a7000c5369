"""Lightning Fabric regression trainer with gradient accumulation (Fabric docs pattern)."""
import argparse
import hashlib

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset
from lightning_fabric import Fabric


def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--accumulate", type=int, default=4)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--n-samples", type=int, default=80)
    p.add_argument("--seed", type=int, default=7)
    return p.parse_args()


class Regressor(nn.Module):
    def __init__(self, d_in=16, d_hidden=32):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(d_in, d_hidden), nn.Tanh(), nn.Linear(d_hidden, d_hidden), nn.Tanh())
        self.out = nn.Linear(d_hidden, 1)

    def forward(self, x):
        return self.out(self.body(x)).squeeze(-1)


def build_dataset(n, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 16, generator=g)
    w = torch.randn(16, generator=g)
    y = torch.sin(x @ w) + 0.1 * torch.randn(n, generator=g)
    return TensorDataset(x, y)


def sha_of(model):
    h = hashlib.sha256()
    for _, p in model.named_parameters():
        h.update(p.detach().float().contiguous().cpu().numpy().tobytes())
    return h.hexdigest()


def main():
    args = parse_args()
    fabric = Fabric(accelerator="cpu", devices=2, strategy="ddp", num_nodes=1)
    fabric.launch()
    fabric.seed_everything(args.seed)

    model = Regressor()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    model, optimizer = fabric.setup(model, optimizer)
    loader = DataLoader(build_dataset(args.n_samples, args.seed), batch_size=args.batch_size, shuffle=False)
    loader = fabric.setup_dataloaders(loader)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=3, gamma=0.7)

    K = args.accumulate
    for epoch in range(args.epochs):
        model.train()
        n_batches = len(loader)
        for batch_idx, (x, y) in enumerate(loader):
            is_accumulating = (batch_idx + 1) % K != 0 and batch_idx + 1 != n_batches
            window = min(K, n_batches - (batch_idx // K) * K)
            with fabric.no_backward_sync(model, enabled=is_accumulating):
                loss = F.mse_loss(model(x), y)
                fabric.backward(loss / window)
            if not is_accumulating:
                optimizer.step()
                optimizer.zero_grad()
                scheduler.step()
        fabric.print(f"epoch {epoch} last loss {loss.item():.4f}")

    if fabric.global_rank == 0:
        print("FINAL_SHA256", sha_of(model.module if hasattr(model, "module") else model))


if __name__ == "__main__":
    main()
