"""Tabular regressor on a ZeRO-1 DeepSpeed engine, with a hand-rolled warm-up.

The engine owns accumulation (config: micro batch 4, GA 2). The LR warm-up is a
client LambdaLR kept outside the engine so it can be logged and checkpointed
with the rest of our run state; it is advanced once per optimizer update.
"""
import hashlib
import json
import os

import deepspeed
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

HERE = os.path.dirname(os.path.abspath(__file__))
CONFIG = os.path.join(HERE, "b_b01_ds.json")
EPOCHS = 2
BASE_LR = 3e-3
WARMUP_UPDATES = 6


class Regressor(nn.Module):
    def __init__(self, d_in=12, d_hidden=32):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(d_in, d_hidden), nn.Tanh(),
                                  nn.Linear(d_hidden, d_hidden), nn.Tanh())
        self.out = nn.Linear(d_hidden, 1)

    def forward(self, x):
        return self.out(self.body(x)).squeeze(-1)


def make_data(n=160, d=12):
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(n, d, generator=g)
    w = torch.randn(d, generator=g)
    y = torch.sin(x @ w) + 0.1 * torch.randn(n, generator=g)
    return TensorDataset(x, y)


def warmup(update):
    return min(1.0, (update + 1) / WARMUP_UPDATES)


def main():
    deepspeed.init_distributed(dist_backend="gloo")
    rank = torch.distributed.get_rank()
    torch.manual_seed(0)
    with open(CONFIG) as f:
        ds_config = json.load(f)

    model = Regressor()
    client_opt = torch.optim.AdamW(model.parameters(), lr=BASE_LR, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(client_opt, warmup)
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=client_opt, config=ds_config)

    ds = make_data()
    sampler = DistributedSampler(ds, shuffle=True, seed=7)
    loader = DataLoader(ds, batch_size=ds_config["train_micro_batch_size_per_gpu"], sampler=sampler)
    loss_fn = nn.MSELoss()

    for epoch in range(EPOCHS):
        sampler.set_epoch(epoch)
        for x, y in loader:
            update_done = engine.is_gradient_accumulation_boundary()
            loss = loss_fn(engine(x), y)
            engine.backward(loss)
            engine.step()
            if update_done:
                sched.step()
    if rank == 0:
        h = hashlib.sha256()
        for _, p in engine.module.named_parameters():
            h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
    torch.distributed.barrier()


if __name__ == "__main__":
    main()
