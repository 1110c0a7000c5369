# corpus: style=plain class=LOSS_SCALE
import torch.nn.functional as F

ACCUM = 8
z_weight = 1e-3


def train(model, opt, loader):
    for it, (tokens, labels) in enumerate(loader):
        out, router_z = model(tokens)
        ce = F.cross_entropy(out.flatten(0, 1), labels.flatten())
        ce = ce / ACCUM
        total = ce + z_weight * router_z  # expect: AG127
        total.backward()
        if (it + 1) % ACCUM == 0:
            opt.step()
            opt.zero_grad()
