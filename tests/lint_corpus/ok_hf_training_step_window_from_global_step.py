# corpus: style=hf class=OK
# the per-update term is added once per optimizer step found from the Trainer's own step
import torch
from transformers import Trainer


class L2Trainer(Trainer):
    def __init__(self, *args, l2=1e-4, **kwargs):
        super().__init__(*args, **kwargs)
        self.l2, self.done_at = l2, -1

    def training_step(self, model, inputs, num_items_in_batch=None):
        if self.state.global_step != self.done_at:
            self.done_at = self.state.global_step
            inputs = {**inputs, "l2": self.l2}
        return super().training_step(model, inputs, num_items_in_batch)
