# corpus: style=nanogpt class=F1
# nanoGPT's division of the job's accumulation count by the processes, kept with a per-rank
# count of 2: K is 1 on two ranks
import os

import torch.distributed as dist

gradient_accumulation_steps = 2
batch_size = 12
dist.init_process_group(backend="gloo")
ddp_world_size = int(os.environ["WORLD_SIZE"])
assert gradient_accumulation_steps % ddp_world_size == 0
gradient_accumulation_steps //= ddp_world_size  # expect: AG335

for iter_num in range(100):
    for micro_step in range(gradient_accumulation_steps):
        model.require_backward_grad_sync = micro_step == gradient_accumulation_steps - 1
        x, y = get_batch("train")
        loss = model(x, y) / gradient_accumulation_steps
        loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
