# corpus: style=deepspeed class=F14
import deepspeed

ds_config = {
    "train_micro_batch_size_per_gpu": 4,
    "gradient_accumulation_steps": 4,
    "gradient_clipping": 1.0,
    "zero_optimization": {"stage": 2, "overlap_comm": True},
}
engine, _, _, _ = deepspeed.initialize(model=net, model_parameters=net.parameters(), config=ds_config)
for i, batch in enumerate(loader):
    engine.backward(engine(batch))
    if (i + 1) % 4 == 0:
        engine.step()  # expect: AG110
