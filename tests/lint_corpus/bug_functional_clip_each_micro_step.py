# corpus: style=plain class=F8
# An optax-style loop: each micro-step's torch.autograd.grad gradients are clipped by global
# norm before they are added to the accumulators, so every micro-batch is clipped on its own.
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
            grads = clip_by_global_norm(grads, 1.0)  # expect: AG312
            for a, g in zip(acc, grads):
                a.add_(g)
        for p, a in zip(params, acc):
            p.grad = a.clone()
        opt.step()
        opt.zero_grad()
        for a in acc:
            a.zero_()
