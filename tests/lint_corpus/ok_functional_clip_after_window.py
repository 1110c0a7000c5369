# corpus: style=plain class=OK
# The same optax-style loop clipping once, after the window's gradients are summed.
import torch

K = 4


def clip_by_global_norm(grads, max_norm):
    norm = torch.sqrt(sum((g ** 2).sum() for g in grads))
    scale = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
    return [g * scale for g in grads]


def train(model, loss_fn, batches, steps):
    params = list(model.parameters())
    opt = torch.optim.AdamW(params, lr=1e-3)
    acc = [torch.zeros_like(p) for p in params]
    for step in range(steps):
        for micro in range(K):
            loss = loss_fn(model, batches[step * K + micro]) / K
            grads = torch.autograd.grad(loss, params)
            for a, g in zip(acc, grads):
                a.add_(g)
        for p, g in zip(params, clip_by_global_norm(acc, 1.0)):
            p.grad = g.clone()
        opt.step()
        opt.zero_grad()
        for a in acc:
            a.zero_()
