# corpus: style=while_loop class=F11
from torch.nn.parallel import DistributedDataParallel as DDP

model = DDP(net)
accum_steps = 4
micro = 0
while micro < total_micro_batches:
    x, y = next(stream)
    loss = loss_fn(model(x), y) / accum_steps
    last_micro = micro % accum_steps == accum_steps - 1
    model.require_backward_grad_sync = last_micro  # expect: AG106
    loss.backward()
    if last_micro:
        optimizer.step()
        optimizer.zero_grad()
    micro += 1
