# corpus: style=ddp class=OK
# the warm start is loaded with assign=True before DDP wraps the model: DDP registers the
# loaded parameters
import torch
from torch.nn.parallel import DistributedDataParallel as DDP


def build(path):
    net = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    state = torch.load(path, mmap=True, weights_only=True)
    net.load_state_dict(state, assign=True)
    model = DDP(net)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3)


model, opt = build("warm.pt")
for i, (x, y) in enumerate(loader):
    (torch.nn.functional.cross_entropy(model(x), y) / 4).backward()
    if (i + 1) % 4 == 0:
        opt.step()
        opt.zero_grad()
