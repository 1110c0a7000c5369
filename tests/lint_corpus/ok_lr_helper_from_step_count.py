# corpus: style=hand_lr class=OK
# the warm-up factor is computed from the count of optimizer steps (it // accum) and written
# into the param groups by a helper at each optimizer step
import torch

accum = 4
opt = torch.optim.Adam(model.parameters(), lr=3e-4)


def warmup_factor(it, warmup_iters):
    return min(1.0, (it + 1) / warmup_iters)


def set_lr(optimizer, base, f):
    for group in optimizer.param_groups:
        group["lr"] = base * f


it = 0
while it < len(data):
    loss = model(data[it]).mean() / accum
    loss.backward()
    it += 1
    if it % accum == 0:
        f = warmup_factor(it // accum, 100)
        set_lr(opt, 3e-4, f)
        opt.step()
        opt.zero_grad()
