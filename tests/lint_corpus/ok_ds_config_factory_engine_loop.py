# corpus: style=deepspeed class=OK
import deepspeed
import torch

ACCUM = 8


def make_ds_cfg():
    return {
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": ACCUM,
        "gradient_clipping": 1.0,
        "zero_optimization": {"stage": 2},
    }


def train(net, batches):
    cfg = make_ds_cfg()
    engine, _, _, _ = deepspeed.initialize(model=net, model_parameters=net.parameters(), config=cfg)
    for x, y in batches:
        loss = torch.nn.functional.mse_loss(engine(x), y)
        engine.backward(loss)
        engine.step()
