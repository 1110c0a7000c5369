# corpus: style=nanogpt class=OK
# nanoGPT's DDP setup: the accumulation steps are set for the whole job as a multiple of
# the world size, then divided by it in place; each rank divides its loss by its own K
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

world_size = int(os.environ.get("WORLD_SIZE", 1))
gradient_accumulation_steps = 5 * world_size


def train(model, get_batch, max_iters, lr=6e-4):
    global gradient_accumulation_steps
    dist.init_process_group("gloo")
    gradient_accumulation_steps //= world_size
    model = DDP(model)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    X, Y = get_batch()
    for _ in range(max_iters):
        for micro_step in range(gradient_accumulation_steps):
            model.require_backward_grad_sync = micro_step == gradient_accumulation_steps - 1
            _, loss = model(X, Y)
            loss = loss / gradient_accumulation_steps
            X, Y = get_batch()
            loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
