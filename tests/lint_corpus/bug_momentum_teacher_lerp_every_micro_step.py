# corpus: style=plain class=F4
# a BYOL-style target network moved towards the online network after every micro-batch
import torch

online, target = build_online(), build_target()
opt = torch.optim.SGD(online.parameters(), lr=0.05, momentum=0.9)
GRAD_ACCUM = 4
tau = 0.99
for step, (a, b) in enumerate(pairs):
    with torch.no_grad():
        t_a, t_b = target(a), target(b)
    loss = (byol_loss(online(a), t_b) + byol_loss(online(b), t_a)) / GRAD_ACCUM
    loss.backward()
    if (step + 1) % GRAD_ACCUM == 0:
        opt.step()
        opt.zero_grad()
    with torch.no_grad():
        for p_t, p_o in zip(target.parameters(), online.parameters()):  # expect: AG158
            p_t.lerp_(p_o, 1 - tau)
