# corpus: style=deepspeed class=OK
# ZeRO-2 engine whose optimizer is given the task weights' parameters too: ZeRO reduces
# every gradient its optimizer holds
import deepspeed
import torch
import torch.nn as nn


class TaskWeights(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.log_vars = nn.Parameter(torch.zeros(n))

    def forward(self, losses):
        return sum(torch.exp(-s) * l + s for s, l in zip(self.log_vars, losses))


ds_config = {"train_micro_batch_size_per_gpu": 8, "gradient_accumulation_steps": 4,
             "gradient_clipping": 1.0, "zero_optimization": {"stage": 2, "overlap_comm": True},
             "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}}}
weights = TaskWeights(2)
params = list(model.parameters()) + list(weights.parameters())
engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=params, config=ds_config)
for i, (x, y) in enumerate(loader):
    a, b = engine(x, y)
    engine.backward(weights([a, b]))
    engine.step()
