# corpus: style=deepspeed class=F1
# the config is written to a JSON file from a dataclass: train_batch_size forgets the world
# size, so DeepSpeed derives gradient_accumulation_steps = ACCUM / W on W processes
import json
from dataclasses import dataclass

import deepspeed


@dataclass
class Cfg:
    micro: int = 8
    accum: int = 4


def write_config(cfg, path):
    conf = {
        "train_batch_size": cfg.micro * cfg.accum,  # expect: AG152
        "train_micro_batch_size_per_gpu": cfg.micro,
        "gradient_clipping": 1.0,
        "zero_optimization": {"stage": 2},
    }
    with open(path, "w") as f:
        json.dump(conf, f)


cfg = Cfg()
write_config(cfg, "ds.json")
engine, optimizer, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config="ds.json")
for step in range(steps):
    for k in range(cfg.accum):
        loss = engine(batches[step * cfg.accum + k])
        engine.backward(loss)
        engine.step()
