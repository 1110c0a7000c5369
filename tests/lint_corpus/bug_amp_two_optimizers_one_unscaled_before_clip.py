# corpus: style=amp class=F8
# One GradScaler for two optimizers; only the body's optimizer is unscaled before a clip over
# the whole model: the head's gradients enter the norm still multiplied by the loss scale.
import torch
import torch.nn.functional as F


def train(model, loader, k=4):
    body = torch.optim.AdamW(model.body.parameters(), lr=1e-3)
    head = torch.optim.SGD(model.head.parameters(), lr=1e-2)
    scaler = torch.amp.GradScaler("cuda")
    for i, (x, y) in enumerate(loader):
        with torch.autocast("cuda", dtype=torch.float16):
            loss = F.cross_entropy(model(x), y) / k
        scaler.scale(loss).backward()
        if (i + 1) % k == 0:
            scaler.unscale_(body)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)  # expect: AG135
            scaler.step(body)
            scaler.step(head)
            scaler.update()
            body.zero_grad()
            head.zero_grad()
