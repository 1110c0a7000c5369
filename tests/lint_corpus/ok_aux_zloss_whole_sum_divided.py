# corpus: style=plain class=OK
# the whole sum is divided by K, and a second z-term's coefficient carries the 1/K itself
import torch
import torch.nn.functional as F

K = 8
z_coef = 1e-4
z_scaled = z_coef / K
opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
for i, (x, y) in enumerate(loader):
    logits, router_z = model(x)
    ce = F.cross_entropy(logits, y)
    z = torch.logsumexp(logits, dim=-1).pow(2).mean()
    loss = (ce + z_coef * z) / K + z_scaled * router_z
    loss.backward()
    if (i + 1) % K == 0:
        opt.step()
        opt.zero_grad()
