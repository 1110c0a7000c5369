# corpus: style=accelerate class=OK
# K is one of several constants unpacked from a tuple; the prepared scheduler steps once per
# window, and its horizon counts the windows: ceil(batches / K) per epoch
import math

import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader
from transformers import get_linear_schedule_with_warmup

MICRO_BS, GRAD_ACCUM, EPOCHS = 4, 4, 2


def main(model, dataset, loss_fn):
    accelerator = Accelerator(gradient_accumulation_steps=GRAD_ACCUM)
    loader = DataLoader(dataset, batch_size=MICRO_BS, shuffle=True)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    total = math.ceil(len(loader) / GRAD_ACCUM) * EPOCHS
    scheduler = get_linear_schedule_with_warmup(optimizer, num_warmup_steps=10, num_training_steps=total)
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
    for _ in range(EPOCHS):
        for batch in loader:
            with accelerator.accumulate(model):
                accelerator.backward(loss_fn(model, batch))
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()
