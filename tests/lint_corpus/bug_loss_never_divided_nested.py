# corpus: style=ddp_nested class=LOSS_SCALE
import contextlib

import torch
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

grad_accum_steps = 4


def train(model: DDP, opt: torch.optim.Optimizer, batches: list, steps: int) -> None:
    for step in range(steps):
        for micro in range(grad_accum_steps):
            x, y = batches[step * grad_accum_steps + micro]
            ctx = model.no_sync() if micro < grad_accum_steps - 1 else contextlib.nullcontext()
            with ctx:
                loss = F.mse_loss(model(x), y)
                loss.backward()  # expect: AG122
        opt.step()
        opt.zero_grad(set_to_none=True)
