# corpus: style=accelerate class=OK
# the window's batches are drawn ahead (to count its tokens), then each runs inside
# accelerator.accumulate, with sync_with_dataloader turned off: the sync follows the
# micro-step count only, one step per window
import torch
from accelerate import Accelerator
from accelerate.utils import GradientAccumulationPlugin


def train(model, loader, k=4):
    plugin = GradientAccumulationPlugin(num_steps=k, sync_with_dataloader=False)
    accelerator = Accelerator(gradient_accumulation_plugin=plugin)
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
            with accelerator.accumulate(model):
                loss = model(**batch).loss_sum / tokens
                accelerator.backward(loss * k * accelerator.num_processes)
                opt.step()
                opt.zero_grad()
