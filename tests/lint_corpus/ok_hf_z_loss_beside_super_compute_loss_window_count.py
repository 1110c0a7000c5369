# corpus: style=hf class=OK
"""An HF Trainer z-loss: the language-model term comes from the Trainer's own compute_loss
given num_items_in_batch (the window's token count: the Trainer then does not divide by K),
the z-loss summed and normalised by the same count: right on one process. On several, the
count is every process's and the parent multiplies its own loss by num_processes, the z-loss
not: a warning (AG362), as nothing in the file says the run is multi-process."""
import torch
from transformers import Trainer, TrainingArguments


class ZLossTrainer(Trainer):
    def __init__(self, *args, z_loss_weight=1e-4, **kwargs):
        super().__init__(*args, **kwargs)
        self.z_loss_weight = z_loss_weight

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        lm_loss, outputs = super().compute_loss(model, inputs, return_outputs=True,
                                                num_items_in_batch=num_items_in_batch)
        valid = inputs["labels"][:, 1:] != -100
        log_z = torch.logsumexp(outputs.logits[:, :-1].float(), dim=-1)
        z_loss = log_z[valid].pow(2).sum() / num_items_in_batch
        loss = lm_loss + self.z_loss_weight * z_loss  # expect: AG362
        return (loss, outputs) if return_outputs else loss


args = TrainingArguments(output_dir="out", gradient_accumulation_steps=4, per_device_train_batch_size=2)
trainer = ZLossTrainer(model=model, args=args, train_dataset=train_ds)
trainer.train()
