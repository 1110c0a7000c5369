# corpus: style=ddp class=OK
import torch
import torch.distributed as dist
import torch.nn.functional as F

K = 4


def train(model, windows, opt):
    world = dist.get_world_size()
    for window in windows:
        labels = torch.cat([y.flatten() for _, y in window])
        ntok = (labels != -100).sum()
        ntok = ntok.float()
        dist.all_reduce(ntok)
        for i, (x, y) in enumerate(window):
            logits = model(x)
            loss = F.cross_entropy(logits.flatten(0, 1), y.flatten(), ignore_index=-100,
                                   reduction="sum")
            (loss * world / ntok).backward()
        opt.step()
        opt.zero_grad()
