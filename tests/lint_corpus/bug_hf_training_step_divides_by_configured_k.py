# corpus: style=hf_trainer class=F7
# a training_step override dividing by the configured K: an epoch's short last window is
# scaled as if full
import torch
from transformers import Trainer, TrainingArguments


class GuardedTrainer(Trainer):
    def training_step(self, model, inputs, num_items_in_batch=None):
        model.train()
        with self.compute_loss_context_manager():
            loss = self.compute_loss(model, inputs, num_items_in_batch=num_items_in_batch)
        if not torch.isfinite(loss):
            loss = loss.nan_to_num(0.0)
        loss = loss / self.args.gradient_accumulation_steps  # expect: AG334
        self.accelerator.backward(loss)
        return loss.detach()


args = TrainingArguments(output_dir="out", gradient_accumulation_steps=3)
GuardedTrainer(model=model, args=args, train_dataset=ds).train()
