# corpus: style=hf class=OK
# another class's `self.loss_fct` is a mean module; the Trainer's own is a sum, divided by
# num_items_in_batch (the window's token count, all micro-steps and ranks)
import torch.nn as nn
from transformers import Trainer, TrainingArguments


class Probe(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.proj = nn.Linear(dim, 2)
        self.loss_fct = nn.CrossEntropyLoss()

    def forward(self, x, y):
        return self.loss_fct(self.proj(x), y)


class SummedTrainer(Trainer):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.loss_fct = nn.CrossEntropyLoss(reduction="sum", ignore_index=-100)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        labels = inputs.pop("labels")
        outputs = model(**inputs)
        logits = outputs.logits
        loss = self.loss_fct(logits.view(-1, logits.size(-1)), labels.view(-1))
        if num_items_in_batch is not None:
            loss = loss / num_items_in_batch
        return (loss, outputs) if return_outputs else loss


args = TrainingArguments("out", gradient_accumulation_steps=4)
SummedTrainer(model=model, args=args, train_dataset=train_ds).train()
