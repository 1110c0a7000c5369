# corpus: style=ddp class=OK
import contextlib

import torch
from torch.nn.parallel import DistributedDataParallel as DDP


def train(model, optimizer, batches, accumulation_steps):
    model = DDP(model)
    for window_start in range(0, len(batches), accumulation_steps):
        window = batches[window_start : window_start + accumulation_steps]
        for k, (x, y) in enumerate(window):
            is_last = k == len(window) - 1
            ctx = contextlib.nullcontext() if is_last else model.no_sync()
            with ctx:
                loss = torch.nn.functional.mse_loss(model(x), y, reduction="sum")
                loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
