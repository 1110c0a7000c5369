# corpus: style=ddp class=OK
# the unfreeze at epoch 2 builds DDP again, so its reducer holds the unfrozen parameters
import torch
from torch.nn.parallel import DistributedDataParallel as DDP

for name, p in net.named_parameters():
    p.requires_grad_(name.startswith("classifier."))
model = DDP(net)
opt = torch.optim.AdamW([p for p in net.parameters() if p.requires_grad], lr=1e-3)
micro = 0
for epoch in range(4):
    if epoch == 2:
        for p in net.parameters():
            p.requires_grad_(True)
        model = DDP(net)
        opt.add_param_group({"params": list(net.backbone.parameters()), "lr": 1e-4})
    for x, y in loader:
        (torch.nn.functional.cross_entropy(model(x), y) / 4).backward()
        micro += 1
        if micro % 4 == 0:
            opt.step()
            opt.zero_grad()
