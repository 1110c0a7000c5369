# corpus: style=deepspeed class=OK
# managed false with the caller's own boundary: step() only at the window's last micro-batch
import deepspeed
import torch

ACCUM = 4
config = {
    "train_micro_batch_size_per_gpu": 8,
    "gradient_accumulation_steps": ACCUM,
    "managed_gradient_accumulation": False,
    "zero_optimization": {"stage": 1},
    "gradient_clipping": 1.0,
}
engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
for i, (x, y) in enumerate(loader):
    loss = torch.nn.functional.cross_entropy(engine(x), y)
    engine.backward(loss)
    if (i + 1) % ACCUM == 0:
        engine.step()
