# corpus: style=deepspeed class=F9
import os
# the DeepSpeed config is built by a method of the run's config dataclass and never sets
# gradient_clipping: DeepSpeed then clips at norm 1.0 without being asked
from dataclasses import dataclass

import deepspeed


@dataclass
class RunConfig:
    micro_batch: int = 4
    grad_accum: int = 8
    lr: float = 3e-4

    def to_ds(self, world):
        return {  # expect: AG203
            "train_batch_size": self.micro_batch * self.grad_accum * world,
            "train_micro_batch_size_per_gpu": self.micro_batch,
            "gradient_accumulation_steps": self.grad_accum,
            "optimizer": {"type": "AdamW", "params": {"lr": self.lr}},
            "zero_optimization": {"stage": 2},  # expect: AG205
        }


cfg = RunConfig()
world = int(os.environ.get("WORLD_SIZE", "1"))
engine, _, loader, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                            config=cfg.to_ds(world), training_data=dataset)
for batch in loader:
    loss = engine(batch)
    engine.backward(loss)
    engine.step()
