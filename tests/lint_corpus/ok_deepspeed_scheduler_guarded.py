# corpus: style=deepspeed class=OK
import deepspeed

engine, optimizer, loader, _ = deepspeed.initialize(model=model, config={
    "train_micro_batch_size_per_gpu": 4,
    "gradient_accumulation_steps": 8,
    "gradient_clipping": 1.0,
})
for batch in loader:
    engine.backward(engine(batch))
    engine.step()
    if engine.is_gradient_accumulation_boundary():
        my_scheduler.step()
