# corpus: style=deepspeed class=OK
# the engine owns the accumulation (GA in the config); the boundary flag is read before
# engine.step() moves the micro-step counter, and gates the client scheduler after it
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
    at_boundary = engine.is_gradient_accumulation_boundary()
    engine.step()
    if at_boundary:
        scheduler.step()
