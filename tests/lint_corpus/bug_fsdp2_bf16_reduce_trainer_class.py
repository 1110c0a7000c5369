# corpus: style=trainer_class class=F12
import torch
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard


class FSDPTrainer:
    def __init__(self, model, cfg):
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16)  # expect: AG126
        for layer in model.blocks:
            fully_shard(layer, mp_policy=mp)
        self.model = fully_shard(model, mp_policy=mp)
        self.accum = cfg.gradient_accumulation_steps
        self.opt = torch.optim.AdamW(model.parameters())

    def train_step(self, micro_batches):
        for i, mb in enumerate(micro_batches):
            self.model.set_requires_gradient_sync(i == len(micro_batches) - 1)
            (self.model(mb).loss / len(micro_batches)).backward()
        self.opt.step()
        self.opt.zero_grad()
