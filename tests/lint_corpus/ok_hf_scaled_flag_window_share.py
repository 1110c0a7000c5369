# corpus: style=hf class=OK
"""A Trainer subclass that says its loss is scaled for accumulation and returns the window's
share: the summed loss over num_items_in_batch."""
import torch.nn.functional as F
from transformers import Trainer, TrainingArguments


class SmoothTrainer(Trainer):
    loss_is_scaled_for_ga = True

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        labels = inputs.pop("labels")
        outputs = model(**inputs)
        loss = F.cross_entropy(outputs.logits, labels, label_smoothing=0.1, reduction="sum")
        loss = loss / num_items_in_batch
        return (loss, outputs) if return_outputs else loss


args = TrainingArguments(output_dir="out", per_device_train_batch_size=8, gradient_accumulation_steps=4)
SmoothTrainer(model=model, args=args, train_dataset=train_ds).train()
