# corpus: style=nanogpt class=F10
# nanoGPT order reversed: DDP wraps the model, then the unwrapped module is compiled and
# trained: the compiled forward never runs DDP's, so no gradient is averaged.
import torch
from torch.nn.parallel import DistributedDataParallel as DDP


def train(model, get_batch, optimizer, ddp=True, max_iters=100, accum=4):
    if ddp:
        model = DDP(model)
    raw_model = model.module if ddp else model
    model = torch.compile(raw_model)
    for it in range(max_iters):
        for micro in range(accum):
            x, y = get_batch()
            logits, loss = model(x, y)  # expect: AG300
            (loss / accum).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
