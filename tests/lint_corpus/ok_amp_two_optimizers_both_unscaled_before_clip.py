# corpus: style=amp class=OK
# One GradScaler for two optimizers, both unscaled before the clip over the whole model.
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
            scaler.unscale_(head)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            scaler.step(body)
            scaler.step(head)
            scaler.update()
            body.zero_grad()
            head.zero_grad()
