# corpus: style=deepspeed class=OK
# ZeRO-3 accumulates correctly across backwards with GA 1 (checked on 0.19.8).
import deepspeed

ds_config = {
    "train_micro_batch_size_per_gpu": 2,
    "gradient_accumulation_steps": 1,
    "gradient_clipping": 0.0,
    "zero_optimization": {"stage": 3},
}
engine, _, _, _ = deepspeed.initialize(model=net, model_parameters=net.parameters(), config=ds_config)
for i, batch in enumerate(loader):
    engine.backward(engine(batch) / 4)
    if (i + 1) % 4 == 0:
        engine.step()
