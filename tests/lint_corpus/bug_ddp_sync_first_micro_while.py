# corpus: style=ddp class=F11
import contextlib

import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

ddp_model = DistributedDataParallel(net)
micro_step = 0
while micro_step < accumulation_steps:
    sync = contextlib.nullcontext() if not micro_step else ddp_model.no_sync()  # expect: AG111
    with sync:
        out = ddp_model(inputs[micro_step])
        (loss_fn(out, targets[micro_step]) / accumulation_steps).backward()
    micro_step += 1
opt.step()
opt.zero_grad()
