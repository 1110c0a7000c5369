# corpus: style=hf_trainer class=OK
from transformers import Trainer, TrainerCallback, TrainingArguments


class MicroNorms(TrainerCallback):
    """Per-micro-batch gradient norms; the window's gradient is put back before the step."""

    def __init__(self):
        self.stash = {}

    def on_substep_end(self, args, state, control, model=None, **kwargs):
        for p in model.parameters():
            if p.grad is None:
                continue
            if p in self.stash:
                self.stash[p].add_(p.grad)
            else:
                self.stash[p] = p.grad.detach().clone()
            p.grad = None

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        for p, buf in self.stash.items():
            if p.grad is None:
                p.grad = buf
            else:
                p.grad.add_(buf)
        self.stash = {}


def main(model, ds):
    args = TrainingArguments(output_dir="out", gradient_accumulation_steps=4, max_steps=10)
    Trainer(model=model, args=args, train_dataset=ds, callbacks=[MicroNorms()]).train()
