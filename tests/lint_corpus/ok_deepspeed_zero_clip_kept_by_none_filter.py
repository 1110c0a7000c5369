# corpus: style=deepspeed class=OK
"""ZeRO-2 config assembled from module settings; unset options are left to DeepSpeed."""
import deepspeed
import torch

MICRO_BS = 4
GRAD_ACCUM = 4
CLIP = 0  # no clipping
STEPS_PER_PRINT = None


def ds_config():
    raw = {
        "train_micro_batch_size_per_gpu": MICRO_BS,
        "gradient_accumulation_steps": GRAD_ACCUM,
        "gradient_clipping": CLIP,
        "steps_per_print": STEPS_PER_PRINT,
        "zero_optimization": {"stage": 2},
    }
    return {key: val for key, val in raw.items() if val is not None}


def main(model, loader):
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                           config=ds_config())
    for x, y in loader:
        loss = torch.nn.functional.mse_loss(engine(x), y)
        engine.backward(loss)
        engine.step()
