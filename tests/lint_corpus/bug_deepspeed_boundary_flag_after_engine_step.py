# corpus: style=deepspeed class=F4
# the engine owns the accumulation (GA in the config); a client scheduler is stepped when the
# boundary flag says so, but the flag is read after engine.step() moved the micro-step counter
import deepspeed
import torch

GRAD_ACCUM = 4
config = {"train_micro_batch_size_per_gpu": 8, "gradient_accumulation_steps": GRAD_ACCUM,
          "gradient_clipping": 1.0, "zero_optimization": {"stage": 2}}
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / 10))
engine, optimizer, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
for batch in loader:
    loss = engine(batch)
    engine.backward(loss)
    engine.step()
    if engine.is_gradient_accumulation_boundary():  # expect: AG315
        scheduler.step()
