# corpus: style=hf class=F5
# HF-style causal LM fine-tuning: padded batches, mean loss per micro-batch, divided by K
import torch
import torch.nn.functional as F


def train(model, loader, optimizer, gradient_accumulation_steps: int):
    model.train()
    for step, batch in enumerate(loader):
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        labels = batch["labels"]
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), labels.view(-1), ignore_index=-100)
        loss = loss / gradient_accumulation_steps  # expect: AG104
        loss.backward()
        if (step + 1) % gradient_accumulation_steps == 0:
            optimizer.step()
            optimizer.zero_grad()
