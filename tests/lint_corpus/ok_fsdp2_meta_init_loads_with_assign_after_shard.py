# corpus: style=fsdp2 class=OK
# torchtitan's order: shard on the meta device, then load the DTensor state dict with
# assign=True; fully_shard's post-load hook takes the loaded tensors as its sharded parameters
import torch
from torch.distributed.fsdp import fully_shard

with torch.device("meta"):
    model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
for layer in model:
    fully_shard(layer)
fully_shard(model)
model.load_state_dict(sharded_state_dict, assign=True)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
for i, (x, y) in enumerate(loader):
    model.set_requires_gradient_sync((i + 1) % 4 == 0)
    (torch.nn.functional.cross_entropy(model(x), y) / 4).backward()
    if (i + 1) % 4 == 0:
        opt.step()
        opt.zero_grad()
