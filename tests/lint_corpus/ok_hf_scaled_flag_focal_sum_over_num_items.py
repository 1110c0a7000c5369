# corpus: style=hf class=OK
"""A focal loss built by hand, summed over the micro-batch's rows and divided by the
window's count the Trainer hands over (times the processes, as the Trainer's own loss does),
under a Trainer told the loss is already scaled for accumulation: the window's share."""
import torch.nn.functional as F
from transformers import Trainer, TrainingArguments


def focal_sum(logits, target, gamma=2.0):
    logp = F.log_softmax(logits.float(), dim=-1).gather(-1, target[:, None]).squeeze(-1)
    return (-((1.0 - logp.exp()) ** gamma) * logp).sum()


class FocalTrainer(Trainer):
    loss_is_scaled_for_ga = True

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        labels = inputs.pop("labels")
        outputs = model(**inputs)
        loss = focal_sum(outputs.logits, labels) / num_items_in_batch
        loss = loss * self.accelerator.num_processes
        return (loss, outputs) if return_outputs else loss


args = TrainingArguments(output_dir="out", per_device_train_batch_size=8, gradient_accumulation_steps=4)
FocalTrainer(model=model, args=args, train_dataset=train_ds).train()
