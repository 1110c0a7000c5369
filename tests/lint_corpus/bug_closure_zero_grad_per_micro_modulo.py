# corpus: style=closure class=F3
# a closure run once per micro-batch clears the gradients before its own backward
import torch
import torch.nn.functional as F

K = 4
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
for i, (x, y) in enumerate(loader):
    def closure():
        opt.zero_grad()  # expect: AG102
        loss = F.cross_entropy(model(x), y) / K
        loss.backward()
        return loss

    closure()
    if (i + 1) % K == 0:
        opt.step()
