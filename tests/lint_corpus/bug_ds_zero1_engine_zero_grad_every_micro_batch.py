# corpus: style=deepspeed class=F3
# the torch habit zero_grad/backward/step kept on DeepSpeed's own loop, ZeRO-1 with GA 4
import deepspeed
import torch

config = {
    "train_micro_batch_size_per_gpu": 8,
    "gradient_accumulation_steps": 4,
    "gradient_clipping": 1.0,
    "zero_optimization": {"stage": 1},
}
engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
for x, y in loader:
    engine.zero_grad()  # expect: AG310
    loss = torch.nn.functional.cross_entropy(engine(x), y)
    engine.backward(loss)
    engine.step()
