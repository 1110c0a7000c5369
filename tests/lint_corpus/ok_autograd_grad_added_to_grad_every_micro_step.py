# corpus: style=hand class=OK
"""Two tasks; their gradients are taken apart with autograd.grad (to log their norms) and
added to .grad combined."""
import torch


def micro_step(model, params, batch, weights, norms):
    losses = model.task_losses(batch)
    grads = {n: torch.autograd.grad(l / norms[n], params, retain_graph=True) for n, l in losses.items()}
    for i, p in enumerate(params):
        g = sum(weights[n] * grads[n][i] for n in grads)
        p.grad = g if p.grad is None else p.grad + g


def fit(model, windows, opt, weights):
    params = [p for p in model.parameters() if p.requires_grad]
    for micro_batches in windows:
        norms = {"cls": sum(len(b) for b in micro_batches), "reg": sum(len(b) for b in micro_batches)}
        for batch in micro_batches:
            micro_step(model, params, batch, weights, norms)
        opt.step()
        opt.zero_grad(set_to_none=True)
