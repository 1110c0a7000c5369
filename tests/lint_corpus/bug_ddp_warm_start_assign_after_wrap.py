# corpus: style=ddp class=F10
# a warm start loaded with assign=True through the DDP wrapper's module: the loaded tensors
# replace the parameters DDP registered, and nothing averages their gradients
import torch
from torch.nn.parallel import DistributedDataParallel as DDP


def build(path):
    model = DDP(torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)))
    state = torch.load(path, mmap=True, weights_only=True)
    model.module.load_state_dict(state, assign=True)  # expect: AG366
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3)


model, opt = build("warm.pt")
for i, (x, y) in enumerate(loader):
    (torch.nn.functional.cross_entropy(model(x), y) / 4).backward()
    if (i + 1) % 4 == 0:
        opt.step()
        opt.zero_grad()
