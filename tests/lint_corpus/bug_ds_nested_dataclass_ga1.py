# corpus: style=deepspeed class=F2
from dataclasses import asdict, dataclass, field

import deepspeed
import torch


@dataclass
class ZeroCfg:
    stage: int = 2
    overlap_comm: bool = True


@dataclass
class DSConfig:
    train_micro_batch_size_per_gpu: int = 4
    gradient_accumulation_steps: int = 1
    gradient_clipping: float = 1.0
    zero_optimization: ZeroCfg = field(default_factory=ZeroCfg)


ACCUM = 8


def main(model, loader):
    ds_config = asdict(DSConfig())
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=ds_config)
    for i, (x, y) in enumerate(loader):
        loss = torch.nn.functional.cross_entropy(engine(x), y) / ACCUM
        engine.backward(loss)
        if (i + 1) % ACCUM == 0:
            engine.step()  # expect: AG109
