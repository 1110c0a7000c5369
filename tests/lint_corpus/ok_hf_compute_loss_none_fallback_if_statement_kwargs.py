# corpus: style=hf_trainer class=OK
# compute_loss normalises by num_items_in_batch (an if/else falling back to this
# micro-batch's count); the model's forward takes **kwargs, so the Trainer passes the window's count
import torch
import torch.nn.functional as F
from transformers import Trainer, TrainingArguments


class Tagger(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(100, 32)
        self.out = torch.nn.Linear(32, 5)

    def forward(self, input_ids, attention_mask=None, **kwargs):
        return self.out(self.emb(input_ids))


class TagTrainer(Trainer):
    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        labels = inputs.pop("labels")
        logits = model(**inputs)
        total = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100, reduction="sum")
        if num_items_in_batch is not None:
            loss = total / num_items_in_batch
        else:
            loss = total / labels.ne(-100).sum()
        return loss


args = TrainingArguments(output_dir="out", per_device_train_batch_size=4, gradient_accumulation_steps=4)
TagTrainer(model=Tagger(), args=args, train_dataset=dataset).train()
