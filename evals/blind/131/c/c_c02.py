"""Fabric regression with ragged ranks, two optimizers and a mid-run resume.

Rank 0 draws micro-batches of 3 rows, rank 1 of 5.  Each window (K = 3) is read
ahead, so the loss is a sum over rows divided by the window's all-ranks row count
and multiplied by the world size (DDP averages the gradients).  The run stops
after 6 optimizer steps, saves, and a fresh model/optimizers continue from disk.
"""
import hashlib
import os

import torch
import torch.nn as nn
import torch.nn.functional as F
from lightning_fabric import Fabric

K, TOTAL_STEPS, STOP_AT, D_IN = 3, 12, 6, 16
CKPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tmp_scratch", "c_c02_ckpt.pt")


class Regressor(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(D_IN, 48), nn.SiLU(), nn.Linear(48, 48), nn.SiLU())
        self.head = nn.Linear(48, 2)

    def forward(self, x):
        return self.head(self.body(x))


def micro_batch(rank, step, micro):
    rows = 3 if rank == 0 else 5
    g = torch.Generator().manual_seed(1000 * rank + 10 * step + micro)
    x = torch.randn(rows, D_IN, generator=g)
    y = torch.stack([x[:, :4].sum(1), (x[:, 4:8] ** 2).mean(1)], 1) + 0.1 * torch.randn(rows, 2, generator=g)
    return x, y


def build(fabric):
    torch.manual_seed(5)
    model = Regressor()
    opt_body = torch.optim.AdamW(model.body.parameters(), lr=3e-3, weight_decay=0.05)
    opt_head = torch.optim.SGD(model.head.parameters(), lr=2e-2, momentum=0.8)
    model, opt_body, opt_head = fabric.setup(model, opt_body, opt_head)
    return model, opt_body, opt_head


def run(fabric, model, opt_body, opt_head, start, stop):
    for step in range(start, stop):
        window = [micro_batch(fabric.global_rank, step, m) for m in range(K)]
        n_local = torch.tensor(float(sum(len(x) for x, _ in window)))
        n_all = fabric.all_reduce(n_local, reduce_op="sum")
        for m, (x, y) in enumerate(window):
            with fabric.no_backward_sync(model, enabled=m < K - 1):
                err = F.mse_loss(model(x), y, reduction="none").sum()
                fabric.backward(err / n_all * fabric.world_size)
        fabric.clip_gradients(model, opt_body, max_norm=0.5)
        opt_body.step()
        opt_head.step()
        opt_body.zero_grad(set_to_none=True)
        opt_head.zero_grad(set_to_none=True)


def main():
    fabric = Fabric(accelerator="cpu", devices=2, strategy="ddp")
    fabric.launch()
    os.makedirs(os.path.dirname(CKPT), exist_ok=True)

    model, opt_body, opt_head = build(fabric)
    run(fabric, model, opt_body, opt_head, 0, STOP_AT)
    fabric.save(CKPT, {"model": model, "opt_body": opt_body, "opt_head": opt_head, "step": STOP_AT})
    del model, opt_body, opt_head

    model, opt_body, opt_head = build(fabric)       # fresh objects, state comes from the checkpoint
    state = {"model": model, "opt_body": opt_body, "opt_head": opt_head, "step": 0}
    fabric.load(CKPT, state)
    run(fabric, model, opt_body, opt_head, state["step"], TOTAL_STEPS)

    if fabric.global_rank == 0:
        h = hashlib.sha256()
        for _, p in model.module.named_parameters():
            h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)


if __name__ == "__main__":
    main()
