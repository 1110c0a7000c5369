# corpus: style=plain class=OK
import torch
import torch.nn.functional as F

grad_accum_steps = 4


def sum_loss_window(model, opt, batches):
    # a summed loss, never divided: a constant the user chose (not judged)
    for micro in range(grad_accum_steps):
        x, y = batches[micro]
        F.cross_entropy(model(x), y, reduction="sum").backward()
    opt.step()
    opt.zero_grad()


def grads_divided(model, opt, batches):
    # the 1/K applied to the gradients before the step
    for micro in range(grad_accum_steps):
        x, y = batches[micro]
        F.cross_entropy(model(x), y).backward()
    for p in model.parameters():
        if p.grad is not None:
            p.grad.div_(grad_accum_steps)
    opt.step()
    opt.zero_grad()
