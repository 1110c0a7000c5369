# corpus: style=deepspeed class=F2
# GA is a named constant equal to 1 while the loop accumulates K = 4 by hand on ZeRO-1.
import deepspeed

DS_GA = 1
K = 4
ds_config = {
    "train_micro_batch_size_per_gpu": 4,
    "gradient_accumulation_steps": DS_GA,
    "gradient_clipping": 1.0,
    "zero_optimization": {"stage": 1},
}
engine, _, _, _ = deepspeed.initialize(model=net, model_parameters=net.parameters(), config=ds_config)
for i, batch in enumerate(loader):
    engine.backward(engine(batch) / K)
    if (i + 1) % K == 0:
        engine.step()  # expect: AG109
