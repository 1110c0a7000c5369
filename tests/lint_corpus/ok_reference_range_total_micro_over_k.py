# corpus: style=trainer_class class=OK
# the reference takes one step per window over range(n_micro // K): n_micro counts every
# micro-batch of the run (its name says micro), K = cfg.accum; each iteration is a window
import torch
import torch.nn.functional as F


def reference(cfg, ref, batches):
    opt = torch.optim.SGD(ref.parameters(), lr=cfg.lr, momentum=0.9)
    K = cfg.accum
    for s in range(cfg.n_micro // K):
        x = torch.cat([b[0] for b in batches[s * K:(s + 1) * K]])
        y = torch.cat([b[1] for b in batches[s * K:(s + 1) * K]])
        opt.zero_grad()
        F.cross_entropy(ref(x), y).backward()
        torch.nn.utils.clip_grad_norm_(ref.parameters(), 1.0)
        opt.step()
    return ref
