# corpus: style=deepspeed class=OK
"""A DeepSpeed trainer class whose config's WarmupDecayLR horizon comes from a method counting
the loader's micro-batches divided by GA: the optimizer steps the engine makes."""
from dataclasses import dataclass

import deepspeed


@dataclass
class Cfg:
    num_epochs: int = 2
    grad_accum_steps: int = 3


class Trainer:
    def __init__(self, cfg, model, loader):
        self.cfg, self.loader = cfg, loader
        self.engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                                    config=self.ds_config())

    def total_training_steps(self):
        return self.cfg.num_epochs * len(self.loader) // self.cfg.grad_accum_steps

    def ds_config(self):
        c = self.cfg
        return {
            "train_micro_batch_size_per_gpu": 4,
            "gradient_accumulation_steps": c.grad_accum_steps,
            "gradient_clipping": 0.0,
            "scheduler": {"type": "WarmupDecayLR",
                          "params": {"total_num_steps": self.total_training_steps()}},
        }

    def train_epoch(self):
        for x, y in self.loader:
            loss = self.engine(x, y)
            self.engine.backward(loss)
            self.engine.step()
