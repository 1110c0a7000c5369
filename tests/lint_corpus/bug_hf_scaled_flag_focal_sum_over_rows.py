# corpus: style=hf class=LOSS_SCALE
"""A focal loss built by hand (log_softmax + gather), each micro-batch's sum over its own
rows divided by their number, under a Trainer told the loss is already scaled for
accumulation: K micro-batch means per window (blind round 121 b_b01)."""
import torch.nn.functional as F
from transformers import Trainer, TrainingArguments


def focal(logits, target, gamma=2.0):
    logp = F.log_softmax(logits.float(), dim=-1).gather(-1, target[:, None]).squeeze(-1)
    per_row = -((1.0 - logp.exp()) ** gamma) * logp
    return per_row.sum() / target.numel()


class FocalTrainer(Trainer):
    loss_is_scaled_for_ga = True

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        labels = inputs.pop("labels")
        outputs = model(**inputs)
        loss = focal(outputs.logits, labels)  # expect: AG118, AG174
        return (loss, outputs) if return_outputs else loss


args = TrainingArguments(output_dir="out", per_device_train_batch_size=8, gradient_accumulation_steps=4)
FocalTrainer(model=model, args=args, train_dataset=train_ds).train()
