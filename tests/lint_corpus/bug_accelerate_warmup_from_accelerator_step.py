# corpus: style=accelerate class=F4
# a hand warm-up computed from accelerator.step, the micro-batch counter accumulate()
# advances (and resets with each loader): the rate moves 4 times per update
import torch
from accelerate import Accelerator

accelerator = Accelerator(gradient_accumulation_steps=4)
model, opt, loader = accelerator.prepare(model, torch.optim.AdamW(model.parameters()), loader)
for epoch in range(3):
    for x, y in loader:
        with accelerator.accumulate(model):
            accelerator.backward(torch.nn.functional.mse_loss(model(x), y))
            lr = 3e-4 * min(1.0, (accelerator.step + 1) / 100)  # expect: AG367
            for group in opt.param_groups:
                group["lr"] = lr
            opt.step()
            opt.zero_grad()
