# corpus: style=ddp class=OK
# DDP ignores the fixed positional table (a buffer) and the frozen parameters only
from torch.nn.parallel import DistributedDataParallel as DDP

skip = [n for n, _ in model.named_buffers() if n.startswith("pos.")]
skip += [n for n, p in model.named_parameters() if not p.requires_grad]
DDP._set_params_and_buffers_to_ignore_for_model(model, skip)
model = DDP(model)
for i, (x, y) in enumerate(loader):
    loss = model(x, y) / 4
    loss.backward()
    if (i + 1) % 4 == 0:
        opt.step()
        opt.zero_grad()
