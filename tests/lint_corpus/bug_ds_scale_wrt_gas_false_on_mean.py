# corpus: style=deepspeed class=LOSS_SCALE
"""ZeRO-2 with accumulation in the config; the backward was copied from a recipe that
divides by hand, without the division."""
import deepspeed
import torch.nn.functional as F

CFG = {
    "train_micro_batch_size_per_gpu": 8,
    "gradient_accumulation_steps": 4,
    "gradient_clipping": 1.0,
    "zero_optimization": {"stage": 2, "overlap_comm": True},
    "optimizer": {"type": "AdamW", "params": {"lr": 3e-4}},
}


def train(model, loader, epochs):
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                           config=CFG)
    for _ in range(epochs):
        for x, y in loader:
            loss = F.cross_entropy(engine(x), y)
            engine.backward(loss, scale_wrt_gas=False)  # expect: AG162
            engine.step()
