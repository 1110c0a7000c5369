# corpus: style=accelerate class=OK
# the hand warm-up counts optimizer steps itself, once per synced window
import torch
from accelerate import Accelerator

accelerator = Accelerator(gradient_accumulation_steps=4)
model, opt, loader = accelerator.prepare(model, torch.optim.AdamW(model.parameters()), loader)
updates = 0
for epoch in range(3):
    for x, y in loader:
        with accelerator.accumulate(model):
            accelerator.backward(torch.nn.functional.mse_loss(model(x), y))
            lr = 3e-4 * min(1.0, (updates + 1) / 100)
            for group in opt.param_groups:
                group["lr"] = lr
            opt.step()
            opt.zero_grad()
        if accelerator.sync_gradients:
            updates += 1
