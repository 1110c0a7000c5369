# corpus: style=deepspeed class=F14
# the DeepSpeed config is JSON text kept in the script and parsed with json.loads; it sets
# GA = 4 and the loop also gates the step by hand around 4 backwards
import json

import deepspeed
import torch

ENGINE_CONFIG = """
{
    "train_micro_batch_size_per_gpu": 16,
    "gradient_accumulation_steps": 4,
    "gradient_clipping": 1.0,
    "zero_optimization": {"stage": 2, "overlap_comm": true}
}
"""


def fit(net, shards, windows):
    conf = json.loads(ENGINE_CONFIG)
    engine, _, _, _ = deepspeed.initialize(model=net, model_parameters=net.parameters(), config=conf)
    accum = conf["gradient_accumulation_steps"]
    for w in range(windows):
        for j in range(accum):
            x, y = shards[w * accum + j]
            engine.backward(torch.nn.functional.mse_loss(engine(x), y))
        engine.step()  # expect: AG110
