# corpus: style=hf class=F13
# a Trainer subclass adds a per-update L2 term on the window's first micro-batch found with a
# counter of its own: it runs on across epochs while the Trainer restarts its windows
import torch
from transformers import Trainer


class L2Trainer(Trainer):
    def __init__(self, *args, l2=1e-4, **kwargs):
        super().__init__(*args, **kwargs)
        self.l2, self.seen = l2, 0

    def training_step(self, model, inputs, num_items_in_batch=None):
        if self.seen % self.args.gradient_accumulation_steps == 0:  # expect: AG368
            inputs = {**inputs, "l2": self.l2}
        self.seen += 1
        return super().training_step(model, inputs, num_items_in_batch)
