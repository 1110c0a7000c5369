# corpus: style=hf class=OK
import torch
import torch.nn.functional as F
from transformers import Trainer, TrainingArguments

PAD_ID = 0


def collate(rows):
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), PAD_ID)
    labels = torch.full((len(rows), width), -100)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = r
        labels[i, : len(r)] = r
    return {"input_ids": ids, "labels": labels}


def summed_over_count(outputs, labels, num_items_in_batch=None):
    targets = labels[:, 1:].clone()
    targets[targets == -100] = PAD_ID  # the same positions the Trainer leaves out of its count
    logits = outputs.logits[:, :-1].flatten(0, 1)
    return F.cross_entropy(logits, targets.flatten(), ignore_index=PAD_ID,
                           reduction="sum") / num_items_in_batch


def main(model, ds):
    args = TrainingArguments("out", per_device_train_batch_size=4, gradient_accumulation_steps=4,
                             report_to=[])
    Trainer(model=model, args=args, train_dataset=ds, data_collator=collate,
            compute_loss_func=summed_over_count).train()
