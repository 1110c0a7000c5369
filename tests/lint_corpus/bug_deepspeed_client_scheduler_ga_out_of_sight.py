# corpus: style=deepspeed class=F4
import deepspeed
import torch
import torch.nn.functional as F


def ds_config(hp):
    return {
        "train_micro_batch_size_per_gpu": hp["micro_batch"],
        "gradient_accumulation_steps": hp["grad_accum"],
        "gradient_clipping": 1.0,
        "zero_optimization": {"stage": 2},
    }


def train(model, loader, hp):
    optimizer = torch.optim.AdamW(model.parameters(), lr=hp["lr"])
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / 10))
    engine, optimizer, _, _ = deepspeed.initialize(model=model, optimizer=optimizer,
                                                   config=ds_config(hp))
    for x, y in loader:
        loss = F.cross_entropy(engine(x), y)
        engine.backward(loss)
        engine.step()
        scheduler.step()  # expect: AG103
