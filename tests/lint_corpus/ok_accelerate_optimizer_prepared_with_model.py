# corpus: style=accelerate class=OK
"""Fine-tuning with Accelerate; the optimizer is built first and prepared with the model
and the DataLoader."""
import torch
from accelerate import Accelerator


def main(model, loader, epochs=1):
    accelerator = Accelerator(gradient_accumulation_steps=4)
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-5)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    model.train()
    for _ in range(epochs):
        for batch in loader:
            with accelerator.accumulate(model):
                loss = model(**batch).loss
                accelerator.backward(loss)
                optimizer.step()
                optimizer.zero_grad()
