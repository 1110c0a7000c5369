# corpus: style=hf_trainer class=OK
# a Trainer subclass only reads the gradient norm after each training_step (max_norm=inf
# clips nothing); the Trainer clips once per optimizer step by max_grad_norm
import math

import torch
from transformers import Trainer, TrainingArguments


class NormLoggingTrainer(Trainer):
    def training_step(self, model, inputs, num_items_in_batch=None):
        out = super().training_step(model, inputs, num_items_in_batch)
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=math.inf)
        self.log({"micro_grad_norm": float(norm)})
        return out


def run(model, train_ds):
    args = TrainingArguments(output_dir="out", per_device_train_batch_size=4,
                             gradient_accumulation_steps=8, max_grad_norm=1.0,
                             learning_rate=3e-4, report_to=[])
    NormLoggingTrainer(model=model, args=args, train_dataset=train_ds).train()
