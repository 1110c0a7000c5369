# corpus: style=deepspeed class=LOSS_SCALE
# the loss is normalised by the window's token count (over a slice of K x W micro-batches,
# the same on every rank) times W, and the engine divides it by its GA once more: G / K
import deepspeed
import torch

K, MB = 4, 8
world = torch.distributed.get_world_size()
rank = torch.distributed.get_rank()
config = {"train_micro_batch_size_per_gpu": MB, "gradient_accumulation_steps": K,
          "gradient_clipping": 1.0, "zero_optimization": {"stage": 1}}
engine, _, _, _ = deepspeed.initialize(model=build_model(), model_parameters=None, config=config)
span = K * world * MB
for step in range(100):
    start = step * span
    n_tokens = mask[start:start + span].sum()
    for k in range(K):
        rows = slice(start + (k * world + rank) * MB, start + (k * world + rank + 1) * MB)
        loss = token_sse(engine, inputs[rows], targets[rows], mask[rows]) / n_tokens * world  # expect: AG134
        engine.backward(loss)
        engine.step()
