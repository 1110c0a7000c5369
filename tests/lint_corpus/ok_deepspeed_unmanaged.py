# corpus: style=deepspeed class=OK
# managed_gradient_accumulation false: step() is the boundary the caller owns.
import deepspeed

ds_config = {
    "train_micro_batch_size_per_gpu": 2,
    "gradient_clipping": 1.0,
    "managed_gradient_accumulation": False,
    "zero_optimization": {"stage": 2},
}
engine, _, _, _ = deepspeed.initialize(model=net, model_parameters=net.parameters(), config=ds_config)
for i, batch in enumerate(loader):
    engine.backward(engine(batch) / accumulation_steps)
    if (i + 1) % accumulation_steps == 0:
        engine.step()
