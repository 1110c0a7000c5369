# corpus: style=deepspeed class=F10
# learned loss weights in a module the engine does not hold, stepped by the client
# optimizer: ZeRO-0 all-reduces its module's gradients only
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
optimizer = torch.optim.AdamW([{"params": model.parameters()},  # expect: AG180
                               {"params": weights.parameters(), "lr": 1e-2}], lr=1e-4)
engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=ds_config)
for x, y in loader:
    a, b = engine(x, y)
    engine.backward(weights(a, b))
    engine.step()
