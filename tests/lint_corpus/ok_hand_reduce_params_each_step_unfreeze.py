# corpus: style=plain class=OK
# the same loop reducing whatever has a gradient at each step: the unfrozen backbone too
import torch
import torch.distributed as dist


def train(model, opt, loader, accum=2, unfreeze_at=100):
    for p in model.backbone.parameters():
        p.requires_grad = False
    trainable = list(filter(lambda p: p.requires_grad, model.parameters()))
    for step, window in enumerate(loader):
        if step == unfreeze_at:
            for p in model.backbone.parameters():
                p.requires_grad = True
        for x, y in window:
            (torch.nn.functional.mse_loss(model(x), y) / accum).backward()
        for p in (q for q in model.parameters() if q.grad is not None):
            dist.all_reduce(p.grad)
            p.grad /= dist.get_world_size()
        opt.step()
        opt.zero_grad()
