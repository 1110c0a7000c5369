# corpus: style=hf class=OK
# the probe's gradient is read and cleared before the window's first backward
import torch
from transformers import Trainer, TrainerCallback, TrainingArguments


class GradProbe(TrainerCallback):
    def __init__(self, batch):
        self.batch, self.norms = batch, []

    def on_step_begin(self, args, state, control, model=None, **kwargs):
        loss = model(**self.batch).loss
        loss.backward()
        self.norms.append(sum(p.grad.norm() ** 2 for p in model.parameters() if p.grad is not None))
        model.zero_grad(set_to_none=True)


args = TrainingArguments(output_dir="out", gradient_accumulation_steps=4)
Trainer(model=model, args=args, train_dataset=ds, callbacks=[GradProbe(probe)]).train()
