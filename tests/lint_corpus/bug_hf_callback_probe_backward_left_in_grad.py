# corpus: style=hf class=F7
# a callback measures a probe batch's gradient norm with a backward of its own at the start
# of each step and never clears it: the window's micro-batches add to the probe's gradient
import torch
from transformers import Trainer, TrainerCallback, TrainingArguments


class GradProbe(TrainerCallback):
    def __init__(self, batch):
        self.batch, self.norms = batch, []

    def on_step_begin(self, args, state, control, model=None, **kwargs):
        loss = model(**self.batch).loss
        loss.backward()  # expect: AG371
        self.norms.append(sum(p.grad.norm() ** 2 for p in model.parameters() if p.grad is not None))


args = TrainingArguments(output_dir="out", gradient_accumulation_steps=4)
Trainer(model=model, args=args, train_dataset=ds, callbacks=[GradProbe(probe)]).train()
