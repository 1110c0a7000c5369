# corpus: style=hf class=LOSS_SCALE
"""A Trainer subclass that says its loss is scaled for accumulation while returning each
micro-batch's mean: the Trainer never divides it by K."""
import torch.nn.functional as F
from transformers import Trainer, TrainingArguments


class SmoothTrainer(Trainer):
    loss_is_scaled_for_ga = True

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        labels = inputs.pop("labels")
        outputs = model(**inputs)
        loss = F.cross_entropy(outputs.logits, labels, label_smoothing=0.1)  # expect: AG118, AG174
        return (loss, outputs) if return_outputs else loss


args = TrainingArguments(output_dir="out", per_device_train_batch_size=8, gradient_accumulation_steps=4)
SmoothTrainer(model=model, args=args, train_dataset=train_ds).train()
