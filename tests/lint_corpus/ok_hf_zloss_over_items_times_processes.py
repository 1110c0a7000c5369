# corpus: style=hf_trainer class=OK
# the z-loss over the all-process token count multiplied by num_processes, as the parent
# multiplies its own loss: after DDP's mean both weigh their coefficients
import torch
from transformers import Trainer, TrainingArguments


class ZLossTrainer(Trainer):
    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        valid = inputs["labels"][:, 1:].ne(-100)
        lm_loss, outputs = super().compute_loss(model, inputs, return_outputs=True,
                                                num_items_in_batch=num_items_in_batch)
        lse = torch.logsumexp(outputs.logits[:, :-1].float(), dim=-1)
        z_loss = (lse.pow(2) * valid).sum() / num_items_in_batch
        loss = lm_loss + 1e-4 * z_loss * self.accelerator.num_processes
        return (loss, outputs) if return_outputs else loss


args = TrainingArguments(output_dir="out", gradient_accumulation_steps=4, ddp_backend="gloo")
ZLossTrainer(model=model, args=args, train_dataset=ds).train()
