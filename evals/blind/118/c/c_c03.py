"""Fabric (2 CPU DDP ranks): regression with uneven per-rank batches, two optimizers,
and an interruption: train 5 updates, save, rebuild every object, load, finish 10.

Rank 0 draws 3 samples per micro-batch, rank 1 draws 5. Each micro-step's loss is the
squared-error sum over the window's all-ranks sample count, times world size.
K = 2 micro-batches per update; no_backward_sync spans forward and backward.
"""
import hashlib
import os
import shutil

os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("MASTER_PORT", "49251")

import torch
import torch.nn as nn
from lightning_fabric import Fabric

K = 2
TOTAL_UPDATES = 10
STOP_AT = 5
IN, OUT = 12, 3
CKPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "c_c03_ckpt", "state.pt")


class Regressor(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(IN, 32), nn.SiLU(), nn.Linear(32, 32), nn.SiLU())
        self.head = nn.Linear(32, OUT)

    def forward(self, x):
        return self.head(self.encoder(x))


def micro_batch(rank, update, micro):
    n = 3 if rank == 0 else 5
    g = torch.Generator().manual_seed(10_000 * rank + 100 * update + micro)
    x = torch.randn(n, IN, generator=g)
    w = torch.linspace(-1, 1, IN * OUT).reshape(IN, OUT)
    y = torch.tanh(x @ w) + 0.05 * torch.randn(n, OUT, generator=g)
    return x, y


def build(fabric):
    torch.manual_seed(77)
    model = Regressor()
    opt_enc = torch.optim.Adam(model.encoder.parameters(), lr=3e-3)
    opt_head = torch.optim.SGD(model.head.parameters(), lr=0.02, momentum=0.9, nesterov=True)
    model, opt_enc, opt_head = fabric.setup(model, opt_enc, opt_head)
    return model, opt_enc, opt_head


def train(fabric, model, opts, start, stop):
    for update in range(start, stop):
        window = [micro_batch(fabric.global_rank, update, m) for m in range(K)]
        count = torch.tensor(float(sum(x.shape[0] for x, _ in window)))
        count = fabric.all_reduce(count, reduce_op="sum")
        for m, (x, y) in enumerate(window):
            with fabric.no_backward_sync(model, enabled=m < K - 1):
                pred = model(x)
                loss = ((pred - y) ** 2).sum() / count * fabric.world_size
                fabric.backward(loss)
        for o in opts:
            o.step()
        for o in opts:
            o.zero_grad()


def main():
    fabric = Fabric(accelerator="cpu", devices=2, strategy="ddp")
    fabric.launch()

    model, opt_enc, opt_head = build(fabric)
    train(fabric, model, (opt_enc, opt_head), 0, STOP_AT)
    if fabric.global_rank == 0:
        os.makedirs(os.path.dirname(CKPT), exist_ok=True)
    fabric.barrier()
    fabric.save(CKPT, {"model": model, "opt_enc": opt_enc, "opt_head": opt_head, "update": STOP_AT})
    fabric.barrier()
    del model, opt_enc, opt_head

    # "new job": rebuild everything, then restore
    model, opt_enc, opt_head = build(fabric)
    state = {"model": model, "opt_enc": opt_enc, "opt_head": opt_head, "update": 0}
    fabric.load(CKPT, state)
    train(fabric, model, (opt_enc, opt_head), state["update"], TOTAL_UPDATES)

    fabric.barrier()
    if fabric.global_rank == 0:
        named = list(model.module.named_parameters())
        flat = torch.cat([p.detach().float().reshape(-1) for _, p in named])
        print("FINAL_SHA256", hashlib.sha256(flat.numpy().tobytes()).hexdigest(), flush=True)
        shutil.rmtree(os.path.dirname(CKPT), ignore_errors=True)
    fabric.barrier()


if __name__ == "__main__":
    main()
