# corpus: style=deepspeed class=F2
import deepspeed
import torch

BASE = {
    "train_micro_batch_size_per_gpu": 2,
    "gradient_clipping": 1.0,
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
}


def build_ds_config():
    zero = {"stage": 2, "contiguous_gradients": True}
    return dict(**BASE, gradient_accumulation_steps=1, zero_optimization=zero)


def train(model, loader, grad_accum=4):
    engine, opt, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                             config=build_ds_config())
    for step, batch in enumerate(loader):
        loss = engine(batch).mean() / grad_accum
        engine.backward(loss)
        if (step + 1) % grad_accum == 0:
            engine.step()  # expect: AG109
