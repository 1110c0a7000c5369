# corpus: style=accelerate class=LOSS_SCALE
import torch
from accelerate import Accelerator

GRAD_ACCUM = 4
accelerator = Accelerator(gradient_accumulation_steps=GRAD_ACCUM)


def step_loss(model, batch):
    out = model(**batch)
    return out.loss / GRAD_ACCUM


def train(model, loader):
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-5)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    for batch in loader:
        with accelerator.accumulate(model):
            loss = step_loss(model, batch)
            accelerator.backward(loss)  # expect: AG121
            optimizer.step()
            optimizer.zero_grad()
