# corpus: style=plain class=OK
import torch.nn.functional as F

ACCUM = 8
z_weight = 1e-3


def train(model, opt, loader):
    for it, (tokens, labels) in enumerate(loader):
        out, router_z = model(tokens)
        ce = F.cross_entropy(out.flatten(0, 1), labels.flatten())
        ce = ce / ACCUM
        router_z = router_z / ACCUM
        total = ce + z_weight * router_z
        total.backward()
        if (it + 1) % ACCUM == 0:
            opt.step()
            opt.zero_grad()
