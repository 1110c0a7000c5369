# corpus: style=hf class=OK
"""The fixed twin of bug_hf_compute_loss_super_drops_count: the count reaches the parent
through **kwargs (blind round 126 b_b01 fixed)."""
import torch
from transformers import Trainer


class SFTWithAccuracy(Trainer):
    def compute_loss(self, model, inputs, return_outputs=False, **kwargs):
        loss, outputs = super().compute_loss(model, inputs, return_outputs=True, **kwargs)
        with torch.no_grad():
            self.hits = int(outputs.logits.argmax(-1).eq(inputs["labels"]).sum())
        return (loss, outputs) if return_outputs else loss
