# corpus: style=deepspeed class=F9
# the config writes "no clipping" under the HF Trainer's name for it: DeepSpeed never reads
# max_grad_norm and clips every update at its default 1.0
import deepspeed
import torch

model = torch.nn.Linear(8, 2)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
ds_config = {  # expect: AG203
    "train_micro_batch_size_per_gpu": 4,
    "gradient_accumulation_steps": 4,
    "max_grad_norm": 0.0,  # expect: AG206
    "zero_optimization": {"stage": 2, "overlap_comm": True},
}
engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, config=ds_config)
for x, y in data:
    engine.backward(torch.nn.functional.mse_loss(engine(x), y))
    engine.step()
