# corpus: style=hf class=OK
# the loss helper takes its reduction as a parameter; compute_loss asks for the sum and
# divides it by num_items_in_batch, the window's token count
import torch.nn.functional as F
from transformers import Trainer, TrainingArguments


def shifted_ce(logits, labels, how="mean"):
    flat = logits[:, :-1].reshape(-1, logits.size(-1))
    return F.cross_entropy(flat, labels[:, 1:].reshape(-1), ignore_index=-100, reduction=how)


class ShiftTrainer(Trainer):
    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        labels = inputs.pop("labels")
        out = model(**inputs)
        loss = shifted_ce(out.logits, labels, how="sum") / num_items_in_batch
        return (loss, out) if return_outputs else loss


args = TrainingArguments(output_dir="runs/shift", per_device_train_batch_size=2,
                         gradient_accumulation_steps=6, learning_rate=1e-4)
ShiftTrainer(model=model, args=args, train_dataset=train_ds).train()
