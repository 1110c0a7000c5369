# corpus: style=deepspeed class=F9
from dataclasses import asdict, dataclass, field

import deepspeed
import torch


@dataclass
class DeepSpeedSettings:
    train_micro_batch_size_per_gpu: int = 8
    gradient_accumulation_steps: int = 1
    zero_optimization: dict = field(default_factory=lambda: {"stage": 3})


model = torch.nn.Linear(256, 256)
engine, _, loader, _ = deepspeed.initialize(
    model=model,
    model_parameters=model.parameters(),
    training_data=dataset,
    config=asdict(DeepSpeedSettings()),  # expect: AG203
)
for x, y in loader:
    loss = torch.nn.functional.mse_loss(engine(x), y)
    engine.backward(loss)
    engine.step()
