# corpus: style=accelerate class=F1
import torch
from accelerate import Accelerator


def train(model, loader, epochs=1):
    accelerator = Accelerator(gradient_accumulation_steps=8, mixed_precision="no")
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    model.train()
    for _ in range(epochs):
        for batch in loader:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = model(**batch).loss
            accelerator.backward(loss)
            optimizer.step()  # expect: AG128
            optimizer.zero_grad()
