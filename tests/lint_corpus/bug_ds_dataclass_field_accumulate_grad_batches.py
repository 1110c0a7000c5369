# corpus: style=deepspeed class=F1
# the DeepSpeed config is asdict() of a nested dataclass whose accumulation field carries
# Lightning's name: DeepSpeed ignores the key and runs an accumulation of 1
from dataclasses import asdict, dataclass, field

import deepspeed


@dataclass
class EngineConfig:
    train_micro_batch_size_per_gpu: int = 4
    accumulate_grad_batches: int = 4  # expect: AG206
    gradient_clipping: float = 0.0


@dataclass
class RunConfig:
    lr: float = 1e-3
    engine: EngineConfig = field(default_factory=EngineConfig)


class EngineTrainer:
    def __init__(self, cfg: RunConfig, model, opt):
        self.engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, config=asdict(cfg.engine))

    def train(self, data):
        for x, y in data:
            self.engine.backward(self.engine(x, y))
            self.engine.step()


EngineTrainer(RunConfig(), model, opt).train(data)
