# corpus: style=accelerate class=OK
# the same factor, its horizon counted in scheduler steps: updates times the number of processes
import torch
from accelerate import Accelerator

cfg = {"updates": 1000, "warmup_steps": 50, "grad_accum": 8, "per_device_batch": 16}
accelerator = Accelerator(gradient_accumulation_steps=cfg["grad_accum"])
W = accelerator.num_processes
global_batch = cfg["per_device_batch"] * cfg["grad_accum"] * W


def factor(step):
    total, warm = cfg["updates"] * W, cfg["warmup_steps"] * W
    if step < warm:
        return step / warm
    return max(0.0, (total - step) / (total - warm))


model = build_model()
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, make_loader(global_batch), scheduler)
for batch in loader:
    with accelerator.accumulate(model):
        accelerator.backward(model(**batch).loss)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
