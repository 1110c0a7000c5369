# corpus: style=nanogpt class=OK
# The DDP wrapper itself is compiled: its forward arms the reduction (the raw module is kept
# for saving and optimizer groups only).
import torch
from torch.nn.parallel import DistributedDataParallel as DDP


def train(model, get_batch, optimizer, ddp=True, max_iters=100, accum=4):
    if ddp:
        model = DDP(model)
    raw_model = model.module if ddp else model
    model = torch.compile(model)
    for it in range(max_iters):
        for micro in range(accum):
            x, y = get_batch()
            logits, loss = model(x, y)
            (loss / accum).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
