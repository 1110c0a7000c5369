# corpus: style=accelerate class=F7
# 50 samples in batches of 5: 10 batches a pass, K = 4, so every pass ends in a window of 2
import torch
import torch.nn.functional as F
from accelerate import Accelerator
from torch.utils.data import DataLoader, TensorDataset

SETTINGS = {"samples": 50, "batch": 5, "accum": 4}


def build_data(n_rows, width):
    feats = torch.randn(n_rows, width) * 0.3
    target = feats.sum(dim=1, keepdim=True)
    return TensorDataset(feats, target)


accelerator = Accelerator(gradient_accumulation_steps=SETTINGS["accum"])
net = torch.nn.Linear(16, 1)
optim = torch.optim.AdamW(net.parameters(), lr=1e-3)
loader = DataLoader(build_data(SETTINGS["samples"], 16), batch_size=SETTINGS["batch"], shuffle=True)
net, optim, loader = accelerator.prepare(net, optim, loader)
for epoch in range(3):
    for feats, target in loader:
        with accelerator.accumulate(net):
            err = F.smooth_l1_loss(net(feats), target)
            accelerator.backward(err)  # expect: AG157
            optim.step()
            optim.zero_grad()
