# corpus: style=deepspeed class=OK
# the same habit under ZeRO-2: the gradient lives in the engine's partitions (measured: no effect)
import deepspeed
import torch

config = {
    "train_micro_batch_size_per_gpu": 8,
    "gradient_accumulation_steps": 4,
    "gradient_clipping": 1.0,
    "zero_optimization": {"stage": 2, "overlap_comm": True},
}
engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
for x, y in loader:
    engine.zero_grad()
    loss = torch.nn.functional.cross_entropy(engine(x), y)
    engine.backward(loss)
    engine.step()
