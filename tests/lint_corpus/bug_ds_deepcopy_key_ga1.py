# corpus: style=deepspeed class=F2
import copy

import deepspeed
import torch

BASE_CONFIG = {
    "train_micro_batch_size_per_gpu": 8,
    "gradient_accumulation_steps": 4,
    "gradient_clipping": 1.0,
    "zero_optimization": {"stage": 2, "overlap_comm": True},
}


def main(model, loader, accum=4):
    config = copy.deepcopy(BASE_CONFIG)
    config["gradient_accumulation_steps"] = 1
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    for i, (x, y) in enumerate(loader):
        engine.backward(torch.nn.functional.cross_entropy(engine(x), y) / accum)
        if (i + 1) % accum == 0:
            engine.step()  # expect: AG109
