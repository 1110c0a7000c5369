# corpus: style=hf class=F5
# the loss module is a class attribute of the Trainer subclass; num_items_in_batch is accepted
# and ignored: with gradient_accumulation_steps = 4 the Trainer adds 4 micro-batch means
import torch.nn as nn
from transformers import Trainer, TrainingArguments


class TokenClassTrainer(Trainer):
    loss_fct = nn.CrossEntropyLoss(ignore_index=-100)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        labels = inputs.pop("labels")
        outputs = model(**inputs)
        logits = outputs.logits
        loss = self.loss_fct(logits.view(-1, logits.size(-1)), labels.view(-1))  # expect: AG118
        return (loss, outputs) if return_outputs else loss


args = TrainingArguments("out", gradient_accumulation_steps=4, per_device_train_batch_size=8)
TokenClassTrainer(model=model, args=args, train_dataset=train_ds).train()
