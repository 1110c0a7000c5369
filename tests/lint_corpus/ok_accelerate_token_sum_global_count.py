# corpus: style=accelerate class=OK
# the same loop with a summed loss over the window's token count: no mean of means
import torch.nn.functional as F
from accelerate import Accelerator

accelerator = Accelerator(gradient_accumulation_steps=8)
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
for batch in loader:
    with accelerator.accumulate(model):
        logits = model(batch["input_ids"])
        loss = F.cross_entropy(
            logits.view(-1, vocab), batch["labels"].view(-1), ignore_index=-100, reduction="sum"
        )
        accelerator.backward(loss * 8 / window_tokens)
        optimizer.step()
        optimizer.zero_grad()
