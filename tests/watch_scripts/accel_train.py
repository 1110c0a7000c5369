"""An Accelerate script (``accelerate launch`` style): ``accumulate()`` with
``gradient_accumulation_steps`` from the command line. ``--bug F3`` clears the gradients
inside the window (``model.zero_grad()`` on every micro-step: only the last micro-batch
reaches the optimizer)."""

import argparse

import torch
from accelerate import Accelerator

p = argparse.ArgumentParser()
p.add_argument("--gradient_accumulation_steps", type=int, default=4)
p.add_argument("--bug", default="none")
args = p.parse_args()

acc = Accelerator(gradient_accumulation_steps=args.gradient_accumulation_steps, cpu=True)
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 2))
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + s))
g = torch.Generator().manual_seed(7)
xs, ys = torch.randn(96, 8, generator=g), torch.randint(0, 2, (96,), generator=g)
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(xs, ys), batch_size=4)
model, opt, loader, sched = acc.prepare(model, opt, loader, sched)
for x, y in loader:
    with acc.accumulate(model):
        if args.bug == "F3":
            model.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        acc.backward(loss)
        if acc.sync_gradients:
            acc.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad()
acc.wait_for_everyone()
acc.print("done")
