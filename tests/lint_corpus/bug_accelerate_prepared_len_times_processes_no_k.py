# corpus: style=accelerate class=F4
import torch
from accelerate import Accelerator
from transformers import get_cosine_schedule_with_warmup

EPOCHS = 3


def train(model, loader, accum=8):
    accelerator = Accelerator(gradient_accumulation_steps=accum)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    updates = EPOCHS * len(loader)
    scheduler = get_cosine_schedule_with_warmup(  # expect: AG124
        optimizer, 100 * accelerator.num_processes,
        updates * accelerator.num_processes)
    scheduler = accelerator.prepare(scheduler)
    for _ in range(EPOCHS):
        for batch in loader:
            with accelerator.accumulate(model):
                accelerator.backward(model(**batch).loss)
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()
