# corpus: style=accelerate class=F1
"""Fine-tuning with Accelerate; the optimizer is built on the wrapped model's parameters,
after `prepare`."""
import torch
from accelerate import Accelerator


def main(model, loader, epochs=1):
    accelerator = Accelerator(gradient_accumulation_steps=4)
    model, loader = accelerator.prepare(model, loader)
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-5)
    model.train()
    for _ in range(epochs):
        for batch in loader:
            with accelerator.accumulate(model):
                loss = model(**batch).loss
                accelerator.backward(loss)
                optimizer.step()  # expect: AG101
                optimizer.zero_grad()
