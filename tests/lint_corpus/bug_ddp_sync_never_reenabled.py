# corpus: style=ddp class=F11
from torch.nn.parallel import DistributedDataParallel as DDP

model = DDP(net)
for i, (x, y) in enumerate(loader):
    model.require_backward_grad_sync = False  # expect: AG111
    loss = crit(model(x), y) / accum_steps
    loss.backward()
    if (i + 1) % accum_steps == 0:
        optimizer.step()
        optimizer.zero_grad()
