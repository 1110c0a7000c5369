# corpus: style=deepspeed class=F14
from dataclasses import dataclass

import deepspeed


@dataclass
class TrainConfig:
    micro_batch_size: int = 2
    gradient_accumulation_steps: int = 16
    lr: float = 3e-4


def main(cfg: TrainConfig):
    ds_config = {
        "train_micro_batch_size_per_gpu": cfg.micro_batch_size,
        "gradient_accumulation_steps": cfg.gradient_accumulation_steps,
        "gradient_clipping": 1.0,
        "zero_optimization": {"stage": 2, "overlap_comm": True},
    }
    engine, *_ = deepspeed.initialize(model=build_model(), config=ds_config)
    for step, batch in enumerate(loader):
        engine.backward(engine(batch))
        if (step + 1) % cfg.gradient_accumulation_steps == 0:
            engine.step()  # expect: AG110
