# corpus: style=deepspeed class=OK
# the same engine stepped after every backward: it gates, reduces and steps the optimizer
import deepspeed
import torch

CFG = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 4,
       "gradient_clipping": 0.0, "zero_optimization": {"stage": 0}}


def train(model, loader):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, config=CFG)
    for i, (x, y) in enumerate(loader):
        engine.backward(torch.nn.functional.mse_loss(engine(x), y))
        engine.step()
