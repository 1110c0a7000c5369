# corpus: style=accelerate class=F4
# a warmup + linear-decay factor sized in optimizer updates, given to accelerator.prepare:
# the prepared scheduler steps num_processes times per update, so on 4 processes it ends at 1/4
import math

import torch
from accelerate import Accelerator

cfg = {"updates": 1000, "warmup_steps": 50, "grad_accum": 8, "per_device_batch": 16}


def factor(step):
    if step < cfg["warmup_steps"]:
        return step / cfg["warmup_steps"]
    return max(0.0, (cfg["updates"] - step) / (cfg["updates"] - cfg["warmup_steps"]))


accelerator = Accelerator(gradient_accumulation_steps=cfg["grad_accum"])
global_batch = cfg["per_device_batch"] * cfg["grad_accum"] * accelerator.num_processes
model = build_model()
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)  # expect: AG125
model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, make_loader(global_batch), scheduler)
for batch in loader:
    with accelerator.accumulate(model):
        accelerator.backward(model(**batch).loss)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
