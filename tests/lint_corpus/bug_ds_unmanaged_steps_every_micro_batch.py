# corpus: style=deepspeed class=F1
# the caller owns the boundary (managed false) but runs DeepSpeed's step-every-micro loop
import deepspeed
import torch

config = {
    "train_micro_batch_size_per_gpu": 8,
    "gradient_accumulation_steps": 4,
    "managed_gradient_accumulation": False,
    "zero_optimization": {"stage": 1},
    "gradient_clipping": 1.0,
}
engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
for x, y in loader:
    loss = torch.nn.functional.cross_entropy(engine(x), y)
    engine.backward(loss)
    engine.step()  # expect: AG305
