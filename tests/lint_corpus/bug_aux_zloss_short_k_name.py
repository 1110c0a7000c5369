# corpus: style=plain class=LOSS_SCALE
# K is read from the boundary test; the z-loss is added beside the divided cross-entropy
import torch
import torch.nn.functional as F

K = 8
z_coef = 1e-4
opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
for i, (x, y) in enumerate(loader):
    logits = model(x)
    ce = F.cross_entropy(logits, y)
    z = torch.logsumexp(logits, dim=-1).pow(2).mean()
    loss = ce / K + z_coef * z  # expect: AG127
    loss.backward()
    if (i + 1) % K == 0:
        opt.step()
        opt.zero_grad()
