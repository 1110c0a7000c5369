# corpus: style=nanogpt class=OK
# nanoGPT's own setting: the count for the whole job, divided by the processes
import os

import torch.distributed as dist

gradient_accumulation_steps = 5 * 8
batch_size = 12
dist.init_process_group(backend="gloo")
ddp_world_size = int(os.environ["WORLD_SIZE"])
assert gradient_accumulation_steps % ddp_world_size == 0
gradient_accumulation_steps //= ddp_world_size

for iter_num in range(100):
    for micro_step in range(gradient_accumulation_steps):
        model.require_backward_grad_sync = micro_step == gradient_accumulation_steps - 1
        x, y = get_batch("train")
        loss = model(x, y) / gradient_accumulation_steps
        loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
