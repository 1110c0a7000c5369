# corpus: style=closure class=OK
# the closure only runs forward and backward; the gradients are cleared after the step
import torch
import torch.nn.functional as F

K = 4
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
for i, (x, y) in enumerate(loader):
    def closure():
        loss = F.cross_entropy(model(x), y) / K
        loss.backward()
        return loss

    closure()
    if (i + 1) % K == 0:
        opt.step()
        opt.zero_grad()
