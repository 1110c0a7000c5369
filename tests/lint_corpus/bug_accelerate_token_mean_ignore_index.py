# corpus: style=accelerate class=F5
# padded batches, cross_entropy with ignore_index (a mean over this micro-batch's own valid
# tokens); accelerator.backward divides each such mean by K: a mean of means
import torch.nn.functional as F
from accelerate import Accelerator

accelerator = Accelerator(gradient_accumulation_steps=8)
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
for batch in loader:
    with accelerator.accumulate(model):
        logits = model(batch["input_ids"])
        loss = F.cross_entropy(logits.view(-1, vocab), batch["labels"].view(-1), ignore_index=-100)
        accelerator.backward(loss)  # expect: AG104
        optimizer.step()
        optimizer.zero_grad()
