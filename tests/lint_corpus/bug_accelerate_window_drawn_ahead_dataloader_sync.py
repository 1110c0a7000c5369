# corpus: style=accelerate class=F1
# the window's batches are drawn ahead (to count its tokens), then each runs inside
# accelerator.accumulate: with sync_with_dataloader on (the default), once the prepared
# loader has yielded its last batch every micro-step is a sync step: the last window steps K times
import torch
from accelerate import Accelerator


def train(model, loader, k=4):
    accelerator = Accelerator(gradient_accumulation_steps=k)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model, opt, loader = accelerator.prepare(model, opt, loader)
    batches = iter(loader)
    while True:
        window = []
        for _ in range(k):
            b = next(batches, None)
            if b is None:
                break
            window.append(b)
        if not window:
            break
        tokens = accelerator.reduce(sum(b["labels"].ne(-100).sum() for b in window), "sum")
        for batch in window:
            with accelerator.accumulate(model):  # expect: AG148
                loss = model(**batch).loss_sum / tokens
                accelerator.backward(loss * k * accelerator.num_processes)
                opt.step()
                opt.zero_grad()
