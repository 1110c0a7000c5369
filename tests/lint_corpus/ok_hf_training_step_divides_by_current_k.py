# corpus: style=hf_trainer class=OK
# the same override dividing by the window's own count, as the Trainer does
import torch
from transformers import Trainer, TrainingArguments


class GuardedTrainer(Trainer):
    def training_step(self, model, inputs, num_items_in_batch=None):
        model.train()
        with self.compute_loss_context_manager():
            loss = self.compute_loss(model, inputs, num_items_in_batch=num_items_in_batch)
        if not torch.isfinite(loss):
            loss = loss.nan_to_num(0.0)
        loss = loss / self.current_gradient_accumulation_steps
        self.accelerator.backward(loss)
        return loss.detach()


args = TrainingArguments(output_dir="out", gradient_accumulation_steps=3)
GuardedTrainer(model=model, args=args, train_dataset=ds).train()
