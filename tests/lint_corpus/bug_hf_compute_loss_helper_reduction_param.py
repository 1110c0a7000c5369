# corpus: style=hf class=F5
# the loss helper takes its reduction as a parameter whose default is "mean": compute_loss
# returns a mean over this micro-batch's tokens and never reads num_items_in_batch
import torch.nn.functional as F
from transformers import Trainer, TrainingArguments


def shifted_ce(logits, labels, how="mean"):
    flat = logits[:, :-1].reshape(-1, logits.size(-1))
    return F.cross_entropy(flat, labels[:, 1:].reshape(-1), ignore_index=-100, reduction=how)


class ShiftTrainer(Trainer):
    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        labels = inputs.pop("labels")
        out = model(**inputs)
        loss = shifted_ce(out.logits, labels)  # expect: AG118
        return (loss, out) if return_outputs else loss


args = TrainingArguments(output_dir="runs/shift", per_device_train_batch_size=2,
                         gradient_accumulation_steps=6, learning_rate=1e-4)
ShiftTrainer(model=model, args=args, train_dataset=train_ds).train()
