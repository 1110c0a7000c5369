# corpus: style=ddp class=F4
"""A warm-up and cosine schedule from a factory, stepped once per optimizer step."""
import math

import torch
import torch.nn.functional as F

ACCUM = 4
EPOCHS = 3


def warmup_cosine(total, warm):
    def factor(step):
        if step < warm:
            return (step + 1) / warm
        return 0.5 * (1 + math.cos(math.pi * min(1.0, (step - warm) / max(1, total - warm))))
    return factor


def train(model, loader):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    total = EPOCHS * len(loader)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, warmup_cosine(total, total // 10))  # expect: AG124
    for _ in range(EPOCHS):
        for i, (x, y) in enumerate(loader):
            (F.cross_entropy(model(x), y) / ACCUM).backward()
            if (i + 1) % ACCUM == 0:  # expect: AG117
                opt.step()
                sched.step()
                opt.zero_grad()
