# corpus: style=nanogpt class=F11
# build-nanogpt style: the sync flag is flipped between forward and backward
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

ddp = dist.is_initialized()
model = DDP(GPT(GPTConfig()), device_ids=[0])
optimizer = torch.optim.AdamW(model.parameters(), lr=6e-4, fused=True)
grad_accum_steps = 16

for step in range(1000):
    optimizer.zero_grad()
    loss_accum = 0.0
    for micro_step in range(grad_accum_steps):
        x, y = train_loader.next_batch()
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
            logits, loss = model(x, y)
        loss = loss / grad_accum_steps
        loss_accum += loss.detach()
        if ddp:
            model.require_backward_grad_sync = micro_step == grad_accum_steps - 1  # expect: AG106
        loss.backward()
    if ddp:
        dist.all_reduce(loss_accum, op=dist.ReduceOp.AVG)
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
