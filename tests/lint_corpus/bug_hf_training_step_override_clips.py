# corpus: style=hf_trainer class=F8
# a Trainer subclass adds its own clipping after each training_step: the Trainer calls it on
# every micro-batch, so each partial sum of the window is clipped
import torch
from transformers import Trainer, TrainingArguments


class SafeTrainer(Trainer):
    def training_step(self, model, inputs, num_items_in_batch=None):
        out = super().training_step(model, inputs, num_items_in_batch)
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=0.5)  # expect: AG138
        return out


def run(model, train_ds):
    args = TrainingArguments(output_dir="out", per_device_train_batch_size=4,
                             gradient_accumulation_steps=8, max_grad_norm=0.0,
                             learning_rate=3e-4, report_to=[])
    SafeTrainer(model=model, args=args, train_dataset=train_ds).train()
