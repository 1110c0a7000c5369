# corpus: style=argparse class=OK
import argparse

import torch
from torch.utils.data import DataLoader

p = argparse.ArgumentParser()
p.add_argument("--batch_size", type=int, default=16)
p.add_argument("--grad_accum_steps", type=int, default=4)
p.add_argument("--epochs", type=int, default=3)
args = p.parse_args()

train_ds = build_dataset()
loader = DataLoader(train_ds, batch_size=args.batch_size, shuffle=True, drop_last=True)
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
total_steps = len(train_ds) // args.batch_size // args.grad_accum_steps * args.epochs
scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=total_steps)
for epoch in range(args.epochs):
    for step, (x, y) in enumerate(loader):
        (loss_fn(model(x), y) / args.grad_accum_steps).backward()  # expect: AG141
        if (step + 1) % args.grad_accum_steps == 0 or step + 1 == len(loader):
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
