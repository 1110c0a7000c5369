# corpus: style=hf class=LOSS_SCALE
"""A Trainer subclass sets loss_is_scaled_for_ga = False to have its per-micro-batch penalty
divided by K, but its LM loss comes from the base compute_loss over num_items_in_batch, the
window's share: the Trainer divides that by K a second time (blind round 122 b_b02)."""
import torch
from transformers import Trainer, TrainingArguments


class PenaltyTrainer(Trainer):
    loss_is_scaled_for_ga = False

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        lm_loss, outputs = super().compute_loss(  # expect: AG343
            model, inputs, return_outputs=True, num_items_in_batch=num_items_in_batch)
        penalty = torch.logsumexp(outputs.logits.float(), dim=-1).pow(2).mean()
        loss = lm_loss + 0.05 * penalty
        return (loss, outputs) if return_outputs else loss


args = TrainingArguments(output_dir="out", per_device_train_batch_size=2, gradient_accumulation_steps=3)
PenaltyTrainer(model=model, args=args, train_dataset=train_ds).train()
