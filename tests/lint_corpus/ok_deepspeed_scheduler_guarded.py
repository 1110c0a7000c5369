# corpus: style=deepspeed class=OK
# the boundary flag is read before engine.step(), which moves the engine's micro-step counter
# (read after it, the flag answers for the next micro-batch: AG315)
import deepspeed

engine, optimizer, loader, _ = deepspeed.initialize(model=model, config={
    "train_micro_batch_size_per_gpu": 4,
    "gradient_accumulation_steps": 8,
    "gradient_clipping": 1.0,
})
for batch in loader:
    engine.backward(engine(batch))
    boundary = engine.is_gradient_accumulation_boundary()
    engine.step()
    if boundary:
        my_scheduler.step()
