# corpus: style=deepspeed class=F2
import deepspeed
import torch

batch = {"train_batch_size": 32, "train_micro_batch_size_per_gpu": 32}
zero2 = {"zero_optimization": {"stage": 2}, "gradient_clipping": 1.0}
ds_config = {**batch, **zero2}


def train(model, loader, grad_acc_steps=4):
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=ds_config)
    for step, (x, y) in enumerate(loader, start=1):
        engine.backward(torch.nn.functional.mse_loss(engine(x), y) / grad_acc_steps)
        if step % grad_acc_steps == 0:
            engine.step()  # expect: AG109
