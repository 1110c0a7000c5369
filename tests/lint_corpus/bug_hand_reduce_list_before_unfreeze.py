# corpus: style=plain class=F10
# the ranks average the gradients of a list of trainable parameters made while the backbone
# was frozen; the backbone is unfrozen at step 100 and its gradients are never averaged
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
        for p in trainable:  # expect: AG185
            dist.all_reduce(p.grad)
            p.grad /= dist.get_world_size()
        opt.step()
        opt.zero_grad()
