"""Regression with Lightning Fabric on 2 CPU ranks, variable-size micro-batches.

Windows of K = 3 micro-batches; an epoch has 8 micro-batches per rank, so each epoch ends
with a window of 2. The loss of a window is the sum of squared errors over all its samples
on all ranks divided by that all-ranks sample count (x world size, DDP averages).
Only the forward runs under no_backward_sync: DDP decides at the forward whether the
backward reduces. Body on AdamW, head on SGD, one clip over the whole model.
"""
import hashlib

import torch
import torch.nn as nn
from lightning_fabric import Fabric

K, EPOCHS, MB_PER_EPOCH, SEED = 3, 3, 8, 5


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh())
        self.head = nn.Linear(64, 1)

    def forward(self, x):
        return self.head(self.body(x)).squeeze(-1)


def epoch_batches(rank, epoch):
    g = torch.Generator().manual_seed(SEED * 1000 + epoch * 10 + rank)
    w = torch.linspace(-1, 1, 16)
    out = []
    for _ in range(MB_PER_EPOCH):
        n = int(torch.randint(3, 9, (1,), generator=g))
        x = torch.randn(n, 16, generator=g)
        y = torch.sin(x @ w) + 0.1 * torch.randn(n, generator=g)
        out.append((x, y))
    return out


def main():
    fabric = Fabric(accelerator="cpu", devices=2, strategy="ddp")
    fabric.launch()
    fabric.seed_everything(SEED)
    torch.use_deterministic_algorithms(True)
    net = Net()
    opt_body = torch.optim.AdamW(net.body.parameters(), lr=2e-3, weight_decay=0.01)
    opt_head = torch.optim.SGD(net.head.parameters(), lr=5e-2, momentum=0.9)
    model, opt_body, opt_head = fabric.setup(net, opt_body, opt_head)
    W = fabric.world_size

    steps = 0
    for epoch in range(EPOCHS):
        batches = epoch_batches(fabric.global_rank, epoch)
        for start in range(0, len(batches), K):
            window = batches[start:start + K]
            n_local = torch.tensor(float(sum(x.shape[0] for x, _ in window)))
            n_all = fabric.all_reduce(n_local, reduce_op="sum")
            for j, (x, y) in enumerate(window):
                last = j == len(window) - 1
                with fabric.no_backward_sync(model, enabled=not last):
                    pred = model(x)
                loss = ((pred - y) ** 2).sum() * W / n_all
                fabric.backward(loss)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
            opt_body.step()
            opt_head.step()
            opt_body.zero_grad(set_to_none=True)
            opt_head.zero_grad(set_to_none=True)
            steps += 1
        fabric.print(f"epoch {epoch} optimizer steps {steps} last loss {loss.item():.4f}")

    if fabric.global_rank == 0:
        h = hashlib.sha256()
        for _, p in net.named_parameters():
            h.update(p.detach().to(torch.float32).contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}")


if __name__ == "__main__":
    main()
