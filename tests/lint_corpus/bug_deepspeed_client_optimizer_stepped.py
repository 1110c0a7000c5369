# corpus: style=deepspeed class=F10
# the engine runs the backwards but the loop steps the client optimizer itself: engine.step()
# never runs, the engine never reaches its GA boundary and never reduces the gradients
import deepspeed
import torch

CFG = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 4,
       "gradient_clipping": 0.0, "zero_optimization": {"stage": 0}}


def train(model, loader):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, config=CFG)
    for i, (x, y) in enumerate(loader):
        engine.backward(torch.nn.functional.mse_loss(engine(x), y))
        if (i + 1) % 4 == 0:
            opt.step()  # expect: AG188
            opt.zero_grad()
