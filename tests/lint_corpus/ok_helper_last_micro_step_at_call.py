# corpus: style=ddp class=OK
import torch

gradient_accumulation_steps = 4


def backward_and_step(model, optimizer, loss):
    """The window's last backward (synchronised), then clip and step."""
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad()


for i, batch in enumerate(loader):
    loss = model(**batch).loss / gradient_accumulation_steps
    if (i + 1) % gradient_accumulation_steps != 0:
        with model.no_sync():  # expect: AG116
            loss.backward()
    else:
        backward_and_step(model, optimizer, loss)
