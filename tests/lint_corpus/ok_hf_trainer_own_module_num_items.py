# corpus: style=hf class=OK
"""A small tagger of our own trained with the stock Trainer; forward divides its summed loss
by the window's label count the Trainer passes."""
import torch.nn as nn
import torch.nn.functional as F
from transformers import Trainer, TrainingArguments


class Tagger(nn.Module):
    def __init__(self, vocab, tags, dim=64):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.out = nn.Linear(dim, tags)

    def forward(self, input_ids, labels=None, num_items_in_batch=None, **unused):
        logits = self.out(self.emb(input_ids))
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100,
                                   reduction="sum" if num_items_in_batch else "mean")
            if num_items_in_batch:
                loss = loss / num_items_in_batch
        return {"loss": loss, "logits": logits}


def main(train_ds):
    args = TrainingArguments(output_dir="out", per_device_train_batch_size=8,
                             gradient_accumulation_steps=4, max_steps=100)
    trainer = Trainer(model=Tagger(1000, 17), args=args, train_dataset=train_ds)
    trainer.train()
