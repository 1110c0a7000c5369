# corpus: style=hf_trainer class=F10
# a learnable logit scale held on the Trainer subclass as a bare nn.Parameter and added to
# its optimizer: the Trainer's DDP wrapper averages the model's gradients only
import math

import torch
import torch.nn as nn
from transformers import Trainer, TrainingArguments


class RetrievalTrainer(Trainer):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.logit_scale = nn.Parameter(torch.tensor(math.log(1 / 0.07)))

    def create_optimizer(self, model=None):
        opt = super().create_optimizer(model)
        opt.add_param_group({"params": [self.logit_scale], "weight_decay": 0.0})  # expect: AG325
        return opt

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        q, d = model(**inputs)
        logits = self.logit_scale.exp() * q @ d.t()
        return nn.functional.cross_entropy(logits, torch.arange(len(q), device=q.device))


args = TrainingArguments(output_dir="out", gradient_accumulation_steps=1,
                         ddp_find_unused_parameters=False)
RetrievalTrainer(model=encoder, args=args, train_dataset=ds).train()
