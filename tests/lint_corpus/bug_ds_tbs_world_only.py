# corpus: style=deepspeed class=F2
# GA absent and derived as 1 (train_batch_size = micro x world size) on ZeRO-2, with a
# manual accumulation loop around engine.step().
import os

import deepspeed

world_size = int(os.environ["WORLD_SIZE"])
config = {
    "train_batch_size": 4 * world_size,
    "train_micro_batch_size_per_gpu": 4,
    "gradient_clipping": 1.0,
    "zero_optimization": {"stage": 2, "overlap_comm": True},
}
engine, _, _, _ = deepspeed.initialize(model=net, model_parameters=net.parameters(), config=config)
accumulation_steps = 8
for step in range(num_updates):
    for _ in range(accumulation_steps):
        engine.backward(engine(next(data)) / accumulation_steps)
    engine.step()  # expect: AG109
