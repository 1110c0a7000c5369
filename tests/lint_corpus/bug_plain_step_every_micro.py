# corpus: style=plain class=F1b
import torch
import torch.nn.functional as F

accumulation_steps = 8
opt = torch.optim.Adam(model.parameters(), lr=3e-4)
for idx, (inputs, targets) in enumerate(dataloader):
    out = model(inputs)
    loss = F.cross_entropy(out, targets) / accumulation_steps
    loss.backward()
    opt.step()  # expect: AG101
    if (idx + 1) % accumulation_steps == 0:
        opt.zero_grad()
