# corpus: style=deepspeed class=F12
import deepspeed

ds_config = {
    "train_micro_batch_size_per_gpu": 1,
    "gradient_accumulation_steps": 64,
    "gradient_clipping": 1.0,
    "bf16": {"enabled": True},  # expect: AG204
    "zero_optimization": {"stage": 1},
}
engine, _, _, _ = deepspeed.initialize(model=net, model_parameters=net.parameters(), config=ds_config)
for batch in loader:
    engine.backward(engine(batch))
    engine.step()
