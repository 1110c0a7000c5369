# corpus: style=deepspeed class=OK
import deepspeed
import torch
import torch.nn.functional as F

ACCUM = 4


def ds_config(ga):
    return {
        "train_micro_batch_size_per_gpu": 8,
        "gradient_accumulation_steps": ga,
        "gradient_clipping": 1.0,
        "zero_optimization": {"stage": 3},
    }


def train(model, loader):
    engine, _, _, _ = deepspeed.initialize(
        model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=1e-4), config=ds_config(1)
    )
    for i, (x, y) in enumerate(loader):
        engine.backward(F.mse_loss(engine(x), y) / ACCUM)
        if (i + 1) % ACCUM == 0:
            engine.step()
