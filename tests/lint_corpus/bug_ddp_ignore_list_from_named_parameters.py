# corpus: style=ddp class=F10
# the names DDP ignores are taken from parameters and buffers under a prefix: the learned
# gain there is never all-reduced
from itertools import chain

from torch.nn.parallel import DistributedDataParallel as DDP

skip = [n for n, _ in chain(model.named_parameters(), model.named_buffers()) if n.startswith("pos.")]
DDP._set_params_and_buffers_to_ignore_for_model(model, skip)  # expect: AG359
model = DDP(model)
for i, (x, y) in enumerate(loader):
    loss = model(x, y) / 4
    loss.backward()
    if (i + 1) % 4 == 0:
        opt.step()
        opt.zero_grad()
