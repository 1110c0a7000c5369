# corpus: style=hf class=OK
"""The fixed twin of bug_hf_trainer_divides_by_accelerator_k: the z-loss divided by the
window's K the Trainer keeps (blind round 126 b_b02 fixed)."""
from transformers import Trainer


class ZLossTrainer(Trainer):
    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        lm_loss, outputs = super().compute_loss(model, inputs, return_outputs=True,
                                                num_items_in_batch=num_items_in_batch)
        acc = self.accelerator
        z = outputs.logits.logsumexp(-1).pow(2).mean()
        z = z * acc.num_processes / self.current_gradient_accumulation_steps
        loss = lm_loss + 1e-4 * z
        return (loss, outputs) if return_outputs else loss
