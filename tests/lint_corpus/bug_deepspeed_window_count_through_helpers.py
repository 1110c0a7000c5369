# corpus: style=deepspeed class=LOSS_SCALE
import deepspeed
import torch
import torch.distributed as dist
import torch.nn.functional as F


def count_labels(micro):
    n = torch.tensor(float(sum(int((b["y"] != -100).sum()) for b in micro)))
    dist.all_reduce(n)
    return n


def token_loss(engine, batch, n_all):
    logits = engine(batch["x"])
    summed = F.cross_entropy(logits.flatten(0, 1), batch["y"].flatten(), reduction="sum")
    return summed * dist.get_world_size() / n_all


def train(model, stream, cfg, steps=100):
    engine, _, _, _ = deepspeed.initialize(
        model=model, model_parameters=model.parameters(),
        config={"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": cfg.accum,
                "gradient_clipping": 1.0, "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}}})
    for _ in range(steps):
        micro = [next(stream) for _ in range(cfg.accum)]
        n_all = count_labels(micro)
        for b in micro:
            engine.backward(token_loss(engine, b, n_all))  # expect: AG134
            engine.step()
