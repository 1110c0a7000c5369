# corpus: style=ds_engine class=OK
# the window-count loss times a name made of the engine's own accumulation steps and the world
# size (engine_divisor = engine.gradient_accumulation_steps() * world): engine.backward's /K
# and the ranks' average undone
import deepspeed
import torch
import torch.distributed as dist
import torch.nn.functional as F

CFG = {"micro": 4, "accum": 8}


def count_labels(window):
    n = sum(int((y != -100).sum()) for _, y in window)
    n = torch.tensor(float(n))
    dist.all_reduce(n)
    return n


def run(model, batches, steps):
    ds_config = {
        "train_micro_batch_size_per_gpu": CFG["micro"],
        "gradient_accumulation_steps": CFG["accum"],
        "gradient_clipping": 0.0,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
    }
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=ds_config)
    world = dist.get_world_size()
    engine_divisor = engine.gradient_accumulation_steps() * world
    for s in range(steps):
        window = batches[s * CFG["accum"]:(s + 1) * CFG["accum"]]
        total = count_labels(window)
        for x, y in window:
            logits = engine(x)
            tok = F.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="sum")
            loss = tok * engine_divisor / total
            engine.backward(loss)
            engine.step()
