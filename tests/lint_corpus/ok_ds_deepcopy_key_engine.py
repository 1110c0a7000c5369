# corpus: style=deepspeed class=OK
import copy

import deepspeed

BASE_CONFIG = {
    "train_micro_batch_size_per_gpu": 8,
    "gradient_accumulation_steps": 1,
    "gradient_clipping": 1.0,
    "zero_optimization": {"stage": 2, "overlap_comm": True},
}


def main(model, loader):
    config = copy.deepcopy(BASE_CONFIG)
    config["gradient_accumulation_steps"] = 4
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    for batch in loader:
        engine.backward(engine(batch).mean())
        engine.step()
