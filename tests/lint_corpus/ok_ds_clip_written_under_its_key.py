# corpus: style=deepspeed class=OK
# the same config with the key DeepSpeed reads: no clipping, as written
import deepspeed
import torch

model = torch.nn.Linear(8, 2)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
ds_config = {
    "train_micro_batch_size_per_gpu": 4,
    "gradient_accumulation_steps": 4,
    "gradient_clipping": 0.0,
    "zero_optimization": {"stage": 2, "overlap_comm": True},
}
engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, config=ds_config)
for x, y in data:
    engine.backward(torch.nn.functional.mse_loss(engine(x), y))
    engine.step()
