# corpus: style=plain class=OK
# the target network moves once per optimizer step, under the step's own boundary test
import torch

online, target = build_online(), build_target()
opt = torch.optim.SGD(online.parameters(), lr=0.05, momentum=0.9)
GRAD_ACCUM = 4
tau = 0.99


def update_target():
    with torch.no_grad():
        for p_t, p_o in zip(target.parameters(), online.parameters()):
            p_t.mul_(tau).add_(p_o, alpha=1 - tau)


for step, (a, b) in enumerate(pairs):
    with torch.no_grad():
        t_a, t_b = target(a), target(b)
    loss = (byol_loss(online(a), t_b) + byol_loss(online(b), t_a)) / GRAD_ACCUM
    loss.backward()
    if (step + 1) % GRAD_ACCUM == 0:
        opt.step()
        opt.zero_grad()
        update_target()
