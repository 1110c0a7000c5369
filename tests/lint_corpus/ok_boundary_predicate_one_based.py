# corpus: style=argparse class=OK
import argparse

import torch
import torch.nn.functional as F


def should_step(step, accum):
    """True on the micro-batch that closes a window."""
    return (step + 1) % accum == 0


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--grad_accum", type=int, default=8)
    args = parser.parse_args()
    model = torch.nn.Linear(32, 10)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loader = [(torch.randn(4, 32), torch.randint(0, 10, (4,))) for _ in range(64)]
    for step, (x, y) in enumerate(loader):
        loss = F.cross_entropy(model(x), y) / args.grad_accum
        loss.backward()
        if should_step(step, args.grad_accum):
            optimizer.step()
            optimizer.zero_grad()


if __name__ == "__main__":
    main()
