# corpus: style=accelerate class=F13
import torch
from accelerate import Accelerator

SAVE_EVERY = 6


def run(model, loader, path, resume=False):
    accelerator = Accelerator(gradient_accumulation_steps=4)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model, opt, loader = accelerator.prepare(model, opt, loader)
    seen = 0
    if resume:
        ck = torch.load(path)
        model.load_state_dict(ck["model"])
        opt.load_state_dict(ck["optimizer"])
        seen = ck["seen"]
        loader = accelerator.skip_first_batches(loader, seen)
    for batch in loader:
        with accelerator.accumulate(model):
            accelerator.backward(model(**batch).loss)
            opt.step()
            opt.zero_grad()
        seen += 1
        if seen % SAVE_EVERY == 0:  # expect: AG150
            torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "seen": seen}, path)
