# corpus: style=accelerate class=OK
"""accelerator.backward(loss) inside accumulate(): Accelerate divides each loss by K."""
import torch
import torch.nn.functional as F
from accelerate import Accelerator

accelerator = Accelerator(gradient_accumulation_steps=8)
model, optimizer, loader = accelerator.prepare(build_model(), build_optimizer(), build_loader())


def train_step(batch):
    logits = model(batch["input_ids"])
    loss = F.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten())
    accelerator.backward(loss)
    return loss


for batch in loader:
    with accelerator.accumulate(model):
        train_step(batch)
        optimizer.step()
        optimizer.zero_grad()
