# corpus: style=accelerate class=F4
import torch
from accelerate import Accelerator


def main(model, loader, cfg):
    accum = cfg["gradient_accumulation_steps"]
    accelerator = Accelerator(gradient_accumulation_steps=accum)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=1000)
    for batch in loader:
        with accelerator.accumulate(model):
            loss = model(**batch).loss
            accelerator.backward(loss)
            optimizer.step()
            scheduler.step()  # expect: AG103
            optimizer.zero_grad()
