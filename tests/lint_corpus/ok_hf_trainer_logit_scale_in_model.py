# corpus: style=hf_trainer class=OK
# the logit scale registered on the model the Trainer wraps: DDP averages it with the rest
import math

import torch
import torch.nn as nn
from transformers import Trainer, TrainingArguments

encoder.register_parameter("logit_scale", nn.Parameter(torch.tensor(math.log(1 / 0.07))))


class RetrievalTrainer(Trainer):
    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        q, d = model(**inputs)
        logits = model.logit_scale.exp() * q @ d.t()
        return nn.functional.cross_entropy(logits, torch.arange(len(q), device=q.device))


args = TrainingArguments(output_dir="out", gradient_accumulation_steps=1,
                         ddp_find_unused_parameters=False)
RetrievalTrainer(model=encoder, args=args, train_dataset=ds).train()
