# corpus: style=hf_trainer class=OK
# a logit scale held on the Trainer subclass, its gradient averaged over the processes by a
# callback before every optimizer step: the ranks' copies stay equal
import math

import torch
import torch.distributed as dist
import torch.nn as nn
from transformers import Trainer, TrainerCallback, TrainingArguments


class AverageScale(TrainerCallback):
    def __init__(self, p):
        self.p = p

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        if dist.is_initialized() and self.p.grad is not None:
            dist.all_reduce(self.p.grad, op=dist.ReduceOp.AVG)


class RetrievalTrainer(Trainer):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.logit_scale = nn.Parameter(torch.tensor(math.log(1 / 0.07)))
        self.add_callback(AverageScale(self.logit_scale))

    def create_optimizer(self, model=None):
        opt = super().create_optimizer(model)
        opt.add_param_group({"params": [self.logit_scale], "weight_decay": 0.0})
        return opt

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        q, d = model(**inputs)
        logits = self.logit_scale.exp() * q @ d.t()
        return nn.functional.cross_entropy(logits, torch.arange(len(q), device=q.device))


args = TrainingArguments(output_dir="out", gradient_accumulation_steps=1,
                         ddp_find_unused_parameters=False)
RetrievalTrainer(model=encoder, args=args, train_dataset=ds).train()
