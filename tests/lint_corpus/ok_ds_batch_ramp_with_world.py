# corpus: style=deepspeed class=OK
# the ramp gives DeepSpeed the global batch: micro-batch x accumulation x ranks
import deepspeed
import torch

MICRO = 4
RAMP = {0: 2, 100: 4, 400: 8}
model = torch.nn.Linear(8, 2)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
engine, _, _, _ = deepspeed.initialize(
    model=model, optimizer=opt,
    config={"train_micro_batch_size_per_gpu": MICRO, "gradient_accumulation_steps": 2,
            "gradient_clipping": 0.0})
for step, (x, y) in enumerate(data):
    if step in RAMP:
        accum = RAMP[step]
        engine.set_train_batch_size(MICRO * accum * engine.dp_world_size)
    engine.backward(torch.nn.functional.mse_loss(engine(x), y))
    engine.step()
