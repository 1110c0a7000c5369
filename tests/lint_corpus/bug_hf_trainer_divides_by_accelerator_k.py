# corpus: style=hf class=LOSS_SCALE
"""A Trainer subclass adding a z-loss per micro-batch, "divided by K" through the Trainer's
Accelerator, whose gradient_accumulation_steps the Trainer sets to 1 (blind round 126
b_b02)."""
from transformers import Trainer


class ZLossTrainer(Trainer):
    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        lm_loss, outputs = super().compute_loss(model, inputs, return_outputs=True,
                                                num_items_in_batch=num_items_in_batch)
        acc = self.accelerator
        z = outputs.logits.logsumexp(-1).pow(2).mean()
        z = z * acc.num_processes / acc.gradient_accumulation_steps  # expect: AG351
        loss = lm_loss + 1e-4 * z
        return (loss, outputs) if return_outputs else loss
