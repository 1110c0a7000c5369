# corpus: style=deepspeed class=F9
"""ZeRO-2 from a JSON file the script writes next to itself."""
import json
import os

import deepspeed
import torch


def write_config(path):
    cfg = {  # expect: AG203
        "train_micro_batch_size_per_gpu": 8,
        "gradient_accumulation_steps": 4,
        "grad_clipping": 0.0,  # expect: AG206
        "zero_optimization": {"stage": 2},  # expect: AG205
    }
    with open(path, "w") as fh:
        json.dump(cfg, fh)


def main(model, loader):
    path = os.path.join(os.path.dirname(__file__), "ds_run.json")
    write_config(path)
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                           config=path)
    for x, y in loader:
        engine.backward(torch.nn.functional.mse_loss(engine(x), y))
        engine.step()
