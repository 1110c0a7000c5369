# corpus: style=deepspeed class=F10
# ZeRO-2 engine; learned task weights in a module of their own, stepped by a separate torch
# optimizer: ZeRO reduces the gradients its own optimizer holds, never these
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
engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=ds_config)
weights = TaskWeights(2)
w_opt = torch.optim.SGD(weights.parameters(), lr=1e-2)  # expect: AG180
for i, (x, y) in enumerate(loader):
    a, b = engine(x, y)
    engine.backward(weights([a, b]))
    engine.step()
    if engine.is_gradient_accumulation_boundary():
        w_opt.step()
        w_opt.zero_grad()
