# corpus: style=hf_trainer class=F8
# A callback clipping through a helper after every micro-batch (to log each norm).
import torch
from transformers import Trainer, TrainerCallback, TrainingArguments


class ClipAndLog(TrainerCallback):
    def __init__(self):
        self.norms = []

    def _clip(self, model):
        self.norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)))

    def on_substep_end(self, args, state, control, model=None, **kw):
        self._clip(model)  # expect: AG138

    def on_pre_optimizer_step(self, args, state, control, model=None, **kw):
        self._clip(model)


def main(model, ds):
    args = TrainingArguments(output_dir="/tmp/out", gradient_accumulation_steps=4, max_grad_norm=0.0)
    Trainer(model=model, args=args, train_dataset=ds, callbacks=[ClipAndLog()]).train()
