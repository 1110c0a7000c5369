# corpus: style=deepspeed class=OK
import deepspeed
import torch
from torch.utils.data import DataLoader

GA = 8
EPOCHS = 3


def main(model, dataset):
    train_loader = DataLoader(dataset, batch_size=4, shuffle=True)
    horizon = EPOCHS * len(train_loader) // GA
    ds_config = {
        "train_micro_batch_size_per_gpu": 4,
        "gradient_accumulation_steps": GA,
        "gradient_clipping": 1.0,
        "optimizer": {"type": "AdamW", "params": {"lr": 3e-4}},
        "scheduler": {"type": "WarmupCosineLR",
                      "params": {"total_num_steps": horizon,
                                 "warmup_num_steps": 10}},
    }
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                           config=ds_config)
    for _ in range(EPOCHS):
        for x, y in train_loader:
            loss = torch.nn.functional.cross_entropy(engine(x), y)
            engine.backward(loss)
            engine.step()
