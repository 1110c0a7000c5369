"""LR schedule horizons (F4) under ``accumguard watch``: one script, several modes.

``accel_*`` run under ``accelerate launch`` (2 processes, K = 2): ``accel_ok`` sizes
the schedule from the DataLoader before ``prepare`` (Accelerate's convention: the prepared
scheduler steps num_processes times per optimizer step), ``accel_bug`` after it (the
horizon in optimizer steps: the schedule ends W x early). ``plain_*`` run in one process
(K = 4): ``plain_ok`` counts optimizer steps, ``plain_bug`` counts micro-batches (the
schedule ends K x late), ``plain_short`` stops after half its horizon (a run cut short by
the user: no finding).
"""

import math
import sys

import torch

mode = sys.argv[1]
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
g = torch.Generator().manual_seed(7)
xs, ys = torch.randn(64, 8, generator=g), torch.randint(0, 2, (64,), generator=g)
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(xs, ys), batch_size=4)
EPOCHS = 2

if mode.startswith("accel"):
    from accelerate import Accelerator
    from transformers import get_linear_schedule_with_warmup

    K = 2
    acc = Accelerator(gradient_accumulation_steps=K, cpu=True)
    if mode == "accel_ok":  # before prepare: len(loader) counts every process's batches
        horizon = math.ceil(len(loader) / K) * EPOCHS
    sched = get_linear_schedule_with_warmup(opt, 1, 10**6)  # replaced below
    model, opt, loader = acc.prepare(model, opt, loader)
    if mode == "accel_bug":  # after prepare: this process's optimizer steps
        horizon = math.ceil(len(loader) / K) * EPOCHS
    sched = acc.prepare(get_linear_schedule_with_warmup(opt, 1, horizon))
    for _ in range(EPOCHS):
        for x, y in loader:
            with acc.accumulate(model):
                loss = torch.nn.functional.cross_entropy(model(x), y)
                acc.backward(loss)
                opt.step()
                sched.step()
                opt.zero_grad()
    acc.wait_for_everyone()
    acc.print("done", sched.get_last_lr())
else:
    K = 4
    per_epoch = math.ceil(len(loader) / K)
    horizon = {"plain_ok": per_epoch * EPOCHS, "plain_bug": len(loader) * EPOCHS,
               "plain_short": per_epoch * EPOCHS * 2}[mode]
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=horizon)
    for _ in range(EPOCHS):
        for i, (x, y) in enumerate(loader):
            loss = torch.nn.functional.cross_entropy(model(x), y) / K
            loss.backward()
            if (i + 1) % K == 0 or i + 1 == len(loader):
                opt.step()
                sched.step()
                opt.zero_grad()
    print("done", sched.get_last_lr())
