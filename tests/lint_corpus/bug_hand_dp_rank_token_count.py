# corpus: style=hand_allreduce class=F6
# Each rank divides its summed loss by its own window's tokens, then the gradients are
# averaged over the ranks: a mean of rank means.
import torch
import torch.distributed as dist
import torch.nn.functional as F


def train(model, opt, windows):
    world = dist.get_world_size()
    for micro in windows:
        ntok = sum((lab != -100).sum() for _, lab in micro).float()
        for ids, labels in micro:
            logits = model(ids)
            s = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100, reduction="sum")
            (s / ntok).backward()  # expect: AG113
        for p in model.parameters():
            dist.all_reduce(p.grad)
            p.grad /= world
        opt.step()
        opt.zero_grad()
