# corpus: style=hf_trainer class=OK
# the window's token count is summed over every process (average_tokens_across_devices is on
# by default) and the override puts the processes on top of it: `scale = W / num_items`
import os

import torch.nn.functional as F
from transformers import Trainer, TrainingArguments


class ResponseOnlyTrainer(Trainer):
    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        labels = inputs.pop("labels")
        out = model(**inputs)
        logits = out.logits[:, :-1].flatten(0, 1)
        summed = F.cross_entropy(logits, labels[:, 1:].flatten(), ignore_index=-100, reduction="sum")
        scale = self.accelerator.num_processes / num_items_in_batch
        loss = summed * scale
        return (loss, out) if return_outputs else loss


world = int(os.environ.get("WORLD_SIZE", 1))
args = TrainingArguments("out", per_device_train_batch_size=2, gradient_accumulation_steps=4)
ResponseOnlyTrainer(model=model, args=args, train_dataset=data).train()
