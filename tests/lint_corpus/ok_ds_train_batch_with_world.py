# corpus: style=deepspeed class=OK
# the global batch written in full (micro x K x world size), and a config that names its
# accumulation explicitly beside a two-factor train_batch_size
import deepspeed
import torch.distributed as dist

MICRO, ACCUM = 8, 4
world_size = dist.get_world_size()
conf = {
    "train_batch_size": MICRO * ACCUM * world_size,
    "train_micro_batch_size_per_gpu": MICRO,
    "gradient_clipping": 1.0,
}
conf_explicit = {
    "train_batch_size": MICRO * ACCUM,
    "train_micro_batch_size_per_gpu": MICRO,
    "gradient_accumulation_steps": ACCUM,
    "gradient_clipping": 1.0,
}
engine, optimizer, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=conf)
for step in range(steps):
    for k in range(ACCUM):
        engine.backward(engine(batches[step * ACCUM + k]))
        engine.step()
