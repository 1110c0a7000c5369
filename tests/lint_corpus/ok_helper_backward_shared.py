# corpus: style=plain class=OK
import torch

accumulation_steps = 4


def backward(loss, scale):
    (loss / scale).backward()


def clip_and_step(model, optimizer):
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad()


# warm-up: one step per batch
for batch in warmup_loader:
    backward(model(batch).mean(), 1)
    clip_and_step(model, optimizer)

# main phase: accumulate
for i, batch in enumerate(loader):
    backward(model(batch).mean(), accumulation_steps)
    if (i + 1) % accumulation_steps == 0:
        clip_and_step(model, optimizer)
