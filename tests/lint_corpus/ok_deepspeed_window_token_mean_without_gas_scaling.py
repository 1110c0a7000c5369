# corpus: style=deepspeed class=OK
import deepspeed
import torch
import torch.distributed as dist
import torch.nn.functional as F

GA = 8


def masked_sum(engine, batch):
    logits = engine(batch["x"])
    return F.cross_entropy(logits.flatten(0, 1), batch["y"].flatten(), ignore_index=-100,
                           reduction="sum")


def train(model, batches, steps):
    engine, _, _, _ = deepspeed.initialize(
        model=model, model_parameters=model.parameters(),
        config={"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": GA,
                "gradient_clipping": 1.0, "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}}})
    world = dist.get_world_size()
    for _ in range(steps):
        micro = [next(batches) for _ in range(GA)]
        total = torch.tensor(float(sum((b["y"] != -100).sum() for b in micro)))
        dist.all_reduce(total)
        for b in micro:
            # the window's mean already: the engine must not divide by GA again
            engine.backward(masked_sum(engine, b) * world / total, scale_wrt_gas=False)
            engine.step()


def train_times_ga(model, batches, steps):
    engine, _, _, _ = deepspeed.initialize(
        model=model, model_parameters=model.parameters(),
        config={"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": GA,
                "gradient_clipping": 1.0, "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}}})
    world = dist.get_world_size()
    for _ in range(steps):
        micro = [next(batches) for _ in range(GA)]
        total = torch.tensor(float(sum((b["y"] != -100).sum() for b in micro)))
        dist.all_reduce(total)
        for b in micro:
            loss = masked_sum(engine, b) * world * GA / total
            engine.backward(loss)
            engine.step()
