# corpus: style=amp class=OK
# step at the top of the loop on a 1-based count: `i % ACCUM == 1` is a no-op step before the
# first backward, then each step applies exactly ACCUM micro-batches
import torch

ACCUM = 8


def train(model, loader, optimizer, accum=ACCUM):
    scaler = torch.cuda.amp.GradScaler()
    for i, (x, y) in enumerate(loader, 1):
        if i % accum == 1:
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.float16):
            loss = model(x, y) / accum
        scaler.scale(loss).backward()
