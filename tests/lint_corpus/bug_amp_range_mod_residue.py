# corpus: style=amp class=F13
# range() counts from 0 and the step follows the backward: `i % ACCUM == 3` closes the first
# window after 4 micro-batches although ACCUM is 8 (then every 8)
import torch

ACCUM = 8


def train(model, batches, optimizer, accum=ACCUM):
    scaler = torch.cuda.amp.GradScaler()
    for i in range(len(batches)):
        x, y = batches[i]
        with torch.autocast("cuda", dtype=torch.float16):
            loss = model(x, y) / accum
        scaler.scale(loss).backward()
        if i % accum == 3:  # expect: AG115
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad(set_to_none=True)
