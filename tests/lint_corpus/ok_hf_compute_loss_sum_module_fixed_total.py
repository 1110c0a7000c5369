# corpus: style=hf class=OK
# another class's `self.loss_fct` is a mean module; the Trainer's own sums, and every
# window holds the same number of target tokens (fixed-length, unpadded sequences), so
# dividing by that constant is the large batch's mean
import torch.nn as nn
from transformers import Trainer, TrainingArguments

SEQ, BATCH, K = 128, 8, 4


class Probe(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.proj = nn.Linear(dim, 2)
        self.loss_fct = nn.CrossEntropyLoss()

    def forward(self, x, y):
        return self.loss_fct(self.proj(x), y)


class FixedTotalTrainer(Trainer):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.loss_fct = nn.CrossEntropyLoss(reduction="sum")

    def compute_loss(self, model, inputs, return_outputs=False, **kwargs):
        labels = inputs.pop("labels")
        outputs = model(**inputs)
        logits = outputs.logits
        loss = self.loss_fct(logits.view(-1, logits.size(-1)), labels.view(-1)) / (SEQ * BATCH)
        return (loss, outputs) if return_outputs else loss


args = TrainingArguments("out", gradient_accumulation_steps=K, per_device_train_batch_size=BATCH)
FixedTotalTrainer(model=model, args=args, train_dataset=train_ds).train()
