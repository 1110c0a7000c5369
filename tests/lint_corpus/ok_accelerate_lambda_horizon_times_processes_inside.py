# corpus: style=accelerate class=OK
"""A prepared LambdaLR whose factor multiplies one process's optimizer steps by the number
of processes where it reads them: counted in scheduler steps, as Accelerate advances it."""
import math

import torch
from accelerate import Accelerator

acc = Accelerator(gradient_accumulation_steps=4)
model = build_model()
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
loader = build_loader()
updates = 3 * math.ceil(len(loader) / acc.num_processes / 4)  # one process's steps
sched = torch.optim.lr_scheduler.LambdaLR(
    opt, lambda s: max(0.0, 1.0 - s / (updates * acc.num_processes)))
model, opt, loader, sched = acc.prepare(model, opt, loader, sched)
for batch in loader:
    with acc.accumulate(model):
        acc.backward(model(**batch).loss)
        opt.step()
        sched.step()
        opt.zero_grad()
