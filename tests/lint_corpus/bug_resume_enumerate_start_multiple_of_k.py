# corpus: style=ddp class=F13
# the loop counts micro-batches from 1 (`i % K == 0` after the backward); the resume starts
# it at steps_done * K, a multiple of K, so the resumed run steps after one micro-batch
import torch


def train(model, opt, loader, first, stop_after=None):
    steps = 0
    for i, (x, y) in enumerate(loader, start=first):
        (torch.nn.functional.mse_loss(model(x), y) / ACCUM).backward()
        if i % ACCUM == 0:  # expect: AG115
            opt.step()
            opt.zero_grad()
            steps += 1
            if stop_after is not None and steps == stop_after:
                return steps
    return steps


ACCUM = 4
done = train(model, opt, loader, 1, stop_after=10)
state = torch.load("ckpt.pt")
train(model, opt, resume_loader(state), state["steps"] * ACCUM)
