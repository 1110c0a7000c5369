# corpus: style=plain class=OK
import torch

gradient_accumulation_steps = 1  # the config knob exists, this loop never accumulates


def train_step(model, optimizer, batch):
    loss = model(batch).mean()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad()
    return loss


def do_step(model, optimizer, batch):
    loss = model(batch).mean()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad()
    return loss


for epoch in range(10):
    for batch in loader:
        do_step(model, optimizer, batch)
