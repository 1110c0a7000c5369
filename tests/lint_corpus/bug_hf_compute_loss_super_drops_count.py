# corpus: style=hf class=LOSS_SCALE
"""A Trainer subclass logging token accuracy: its compute_loss takes **kwargs but calls the
parent without num_items_in_batch, so each micro-batch's mean is not divided by K (blind round
126 b_b01)."""
import torch
from transformers import Trainer


class SFTWithAccuracy(Trainer):
    def compute_loss(self, model, inputs, return_outputs=False, **kwargs):
        loss, outputs = super().compute_loss(model, inputs, return_outputs=True)  # expect: AG350
        with torch.no_grad():
            self.hits = int(outputs.logits.argmax(-1).eq(inputs["labels"]).sum())
        return (loss, outputs) if return_outputs else loss
