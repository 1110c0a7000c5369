# corpus: style=accelerate class=OK
"""The Accelerate docs' recipe for token-level losses under accumulate(): the window's
supervised tokens counted before its micro-batches and gathered over processes, each
micro-batch's summed loss (in a helper) multiplied by K x processes over that count, which
accelerator.backward's /K and DDP's average undo. Not a per-micro-batch mean."""
import torch
import torch.nn.functional as F
from accelerate import Accelerator


def summed_token_loss(logits, labels):
    logits = logits[:, :-1].contiguous()
    labels = labels[:, 1:].contiguous()
    return F.cross_entropy(logits.view(-1, logits.size(-1)), labels.view(-1),
                           ignore_index=-100, reduction="sum")


def train(model, loader, steps, ga=3):
    accelerator = Accelerator(gradient_accumulation_steps=ga)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, eps=1e-6)
    model, opt, loader = accelerator.prepare(model, opt, loader)
    it = iter(loader)
    for _ in range(steps):
        batch_samples = [next(it) for _ in range(ga)]
        num_items_in_batch = sum((b["labels"][:, 1:] != -100).sum() for b in batch_samples)
        num_items_in_batch = accelerator.gather(num_items_in_batch).sum().item()
        for batch in batch_samples:
            with accelerator.accumulate(model):
                logits = model(batch["input_ids"]).logits
                loss = summed_token_loss(logits, batch["labels"])
                loss = loss * ga * accelerator.num_processes / num_items_in_batch
                accelerator.backward(loss)
                opt.step()
                opt.zero_grad()
