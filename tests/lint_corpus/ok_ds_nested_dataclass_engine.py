# corpus: style=deepspeed class=OK
from dataclasses import asdict, dataclass, field

import deepspeed
import torch


@dataclass
class ZeroCfg:
    stage: int = 2  # expect: AG205


@dataclass
class DSConfig:
    train_micro_batch_size_per_gpu: int = 4
    gradient_accumulation_steps: int = 8
    gradient_clipping: float = 1.0
    zero_optimization: ZeroCfg = field(default_factory=ZeroCfg)


def main(model, loader):
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                           config=asdict(DSConfig()))
    for x, y in loader:
        loss = torch.nn.functional.cross_entropy(engine(x), y)
        engine.backward(loss)
        engine.step()
