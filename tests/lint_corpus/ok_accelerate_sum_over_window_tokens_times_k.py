# corpus: style=accelerate class=OK
# a summed loss over the window's token count (all micro-steps, all processes), multiplied
# back by gradient_accumulation_steps (written as a division by count / K) because
# accelerator.backward divides by it: the large batch's token mean
import torch
import torch.nn.functional as F
from accelerate import Accelerator

GRAD_ACCUM = 4
accelerator = Accelerator(gradient_accumulation_steps=GRAD_ACCUM)
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
batches = iter(loader)
for update in range(num_updates):
    window = [next(batches) for _ in range(GRAD_ACCUM)]
    n_tokens = torch.tensor(sum(int((b["labels"] != -100).sum()) for b in window))
    n_tokens = accelerator.gather(n_tokens).sum() / accelerator.num_processes
    for b in window:
        with accelerator.accumulate(model):
            logits = model(b["input_ids"]).logits
            loss = F.cross_entropy(logits.flatten(0, 1), b["labels"].flatten(), ignore_index=-100,
                                   reduction="sum")
            accelerator.backward(loss / (n_tokens / GRAD_ACCUM))
            optimizer.step()
            optimizer.zero_grad()
