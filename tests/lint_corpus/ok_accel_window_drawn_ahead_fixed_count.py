# corpus: style=accelerate class=OK
# windows drawn ahead for a fixed number of updates given by the user (not the loader's
# length // K): whether the loop reaches the loader's last batch is not in sight
import torch
from accelerate import Accelerator


def fit(model, opt, loader, max_updates, K=4):
    accelerator = Accelerator(gradient_accumulation_steps=K)
    model, opt, loader = accelerator.prepare(model, opt, loader)
    stream = iter(loader)
    for _ in range(max_updates):
        chunk = [next(stream) for _ in range(K)]
        for b in chunk:
            with accelerator.accumulate(model):
                loss = model(b).mean()
                accelerator.backward(loss)
                opt.step()
                opt.zero_grad()
