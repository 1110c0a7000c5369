# corpus: style=hf class=OK
"""A Trainer subclass keeps the default loss_is_scaled_for_ga: its LM loss is the window's
share (base compute_loss over num_items_in_batch) and only the per-micro-batch penalty is
divided by the current window's accumulation steps."""
import torch
from transformers import Trainer, TrainingArguments


class PenaltyTrainer(Trainer):
    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        lm_loss, outputs = super().compute_loss(
            model, inputs, return_outputs=True, num_items_in_batch=num_items_in_batch)
        penalty = torch.logsumexp(outputs.logits.float(), dim=-1).pow(2).mean()
        loss = lm_loss + 0.05 * penalty / self.current_gradient_accumulation_steps
        return (loss, outputs) if return_outputs else loss


args = TrainingArguments(output_dir="out", per_device_train_batch_size=2, gradient_accumulation_steps=3)
PenaltyTrainer(model=model, args=args, train_dataset=train_ds).train()
