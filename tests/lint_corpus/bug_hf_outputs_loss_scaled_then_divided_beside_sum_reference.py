# corpus: style=hf class=F5
"""A plain loop over a HF causal LM: `loss = outputs.loss`, then `loss = loss / K`. The
collate function masks prompts and padding with -100, so each micro-batch's loss is a mean
over its own number of response tokens: a mean of means. The reduction='sum' further down
is the script's large-batch reference, not this loss."""
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader


def pad_collate(features, pad_id=0):
    longest = max(len(f["input_ids"]) for f in features)
    ids = torch.full((len(features), longest), pad_id, dtype=torch.long)
    lab = torch.full((len(features), longest), -100, dtype=torch.long)
    for row, f in enumerate(features):
        n = len(f["input_ids"])
        ids[row, :n] = f["input_ids"]
        lab[row, :n] = f["labels"]
    return {"input_ids": ids, "labels": lab}


def train(model, dataloader, args):
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.learning_rate)
    for step, batch in enumerate(dataloader):
        outputs = model(**batch)
        loss = outputs.loss
        loss = loss / args.gradient_accumulation_steps  # expect: AG104
        loss.backward()
        if (step + 1) % args.gradient_accumulation_steps == 0:
            optimizer.step()
            optimizer.zero_grad()


def reference_loss(model, batch):
    logits = model(batch["input_ids"]).logits[:, :-1]
    labels = batch["labels"][:, 1:]
    loss_sum = F.cross_entropy(logits.reshape(-1, logits.size(-1)), labels.reshape(-1),
                               ignore_index=-100, reduction="sum")
    return loss_sum / (labels != -100).sum()


train(model, DataLoader(dataset, batch_size=2, collate_fn=pad_collate), args)
