# corpus: style=hf class=OK
"""The window's label tokens counted at each micro-step over the slice of the K
micro-batches the current one belongs to, and handed to the model as num_items_in_batch:
the HF model then divides its summed loss by the window's count (nothing to divide by K)."""
import torch
from torch.utils.data import DataLoader


def pad_collate(features):
    longest = max(len(f["input_ids"]) for f in features)
    ids = torch.zeros((len(features), longest), dtype=torch.long)
    lab = torch.full((len(features), longest), -100, dtype=torch.long)
    for row, f in enumerate(features):
        ids[row, :len(f["input_ids"])] = f["input_ids"]
        lab[row, :len(f["labels"])] = f["labels"]
    return {"input_ids": ids, "labels": lab}


def train(model, dataloader, args):
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.learning_rate)
    batches = list(dataloader)
    for step, batch in enumerate(batches):
        w0 = (step // args.gradient_accumulation_steps) * args.gradient_accumulation_steps
        num_items = sum(int((b["labels"][:, 1:] != -100).sum())
                        for b in batches[w0:w0 + args.gradient_accumulation_steps])
        outputs = model(**batch, num_items_in_batch=num_items)
        loss = outputs.loss
        loss.backward()
        if (step + 1) % args.gradient_accumulation_steps == 0:
            optimizer.step()
            optimizer.zero_grad()


train(model, DataLoader(dataset, batch_size=2, collate_fn=pad_collate), args)
