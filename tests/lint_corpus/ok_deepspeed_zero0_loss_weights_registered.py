# corpus: style=deepspeed class=OK
# the learned loss weights registered on the model before deepspeed.initialize: the engine
# all-reduces their gradient with the rest
import deepspeed
import torch
import torch.nn as nn


class TaskWeights(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.log_vars = nn.Parameter(torch.zeros(n))

    def forward(self, *losses):
        return sum(torch.exp(-s) * l + s for s, l in zip(self.log_vars, losses))


ds_config = {"train_micro_batch_size_per_gpu": 8, "gradient_accumulation_steps": 4,
             "gradient_clipping": 1.0, "zero_optimization": {"stage": 0}}
weights = TaskWeights(2)
model.task_weights = weights
optimizer = torch.optim.AdamW([{"params": model.parameters()}], lr=1e-4)
engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=ds_config)
for x, y in loader:
    a, b = engine(x, y)
    engine.backward(model.task_weights(a, b))
    engine.step()
