# corpus: style=deepspeed class=OK
from dataclasses import asdict, dataclass, field

import deepspeed
import torch


@dataclass
class DeepSpeedSettings:
    train_micro_batch_size_per_gpu: int = 8
    gradient_accumulation_steps: int = 1
    zero_optimization: dict = field(default_factory=lambda: {"stage": 3})
    gradient_clipping: float = 1.0


model = torch.nn.Linear(256, 256)
engine, _, loader, _ = deepspeed.initialize(
    model=model,
    model_parameters=model.parameters(),
    training_data=dataset,
    config=asdict(DeepSpeedSettings(gradient_clipping=0.0)),
)
for x, y in loader:
    loss = torch.nn.functional.mse_loss(engine(x), y)
    engine.backward(loss)
    engine.step()
