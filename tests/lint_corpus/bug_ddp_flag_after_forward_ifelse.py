# corpus: style=ddp class=F11
# The flag is chosen in an if/else, but after the forward: DDP reads it at the NEXT forward,
# so the last micro-step of every window runs with False and is never all-reduced.
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

ddp = DistributedDataParallel(model.to(device))
opt = torch.optim.Adam(ddp.parameters())
accumulation = 4
for epoch in range(epochs):
    for idx, (inputs, targets) in enumerate(train_loader):
        preds = ddp(inputs)
        loss = criterion(preds, targets) / accumulation
        if (idx + 1) % accumulation == 0:
            ddp.require_backward_grad_sync = True  # expect: AG106
        else:
            ddp.require_backward_grad_sync = False
        loss.backward()
        if (idx + 1) % accumulation == 0:  # expect: AG117
            opt.step()
            opt.zero_grad()
