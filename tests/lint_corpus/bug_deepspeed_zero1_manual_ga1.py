# corpus: style=deepspeed class=F2
import deepspeed

ds_config = {
    "train_micro_batch_size_per_gpu": 2,
    "gradient_accumulation_steps": 1,
    "gradient_clipping": 0.0,
    "zero_optimization": {"stage": 1},
}
model_engine, optimizer, _, _ = deepspeed.initialize(model=net, model_parameters=net.parameters(), config=ds_config)
K = 4
for i, batch in enumerate(loader):
    loss = model_engine(batch) / K
    model_engine.backward(loss)
    if (i + 1) % K == 0:
        model_engine.step()  # expect: AG109
