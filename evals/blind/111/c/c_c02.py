"""Heteroscedastic regression with Lightning Fabric (DDP, 2 CPU ranks), ragged micro-batches,
two optimizers and a resume into fresh objects.

* The loss lives in a model method, ``training_loss``, marked with ``mark_forward_method`` so it
  runs through DDP's forward.
* Micro-batches have different sizes on each rank; a window of K is read ahead and its all-ranks
  sample count is all-reduced; each micro-batch's summed NLL is divided by that count and
  multiplied by W (DDP averages over the ranks).
* Epoch 0 is trained, saved with ``fabric.save``; epoch 1 resumes into newly built objects.
"""
import hashlib
import os
import tempfile

os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("MASTER_PORT", "49212")

import torch
import torch.nn as nn
import torch.nn.functional as F
from lightning_fabric import Fabric

SETTINGS = dict(in_dim=12, hidden=48, K=3, windows_per_epoch=6, epochs=2,
                lr_body=2e-3, lr_head=5e-2, seed=11,
                ckpt=os.path.join(tempfile.gettempdir(), "c_c02_resume_49212.pt"))
SIZES = {0: [3, 5, 4], 1: [5, 3, 6]}  # per-rank micro-batch sizes, cycled


class HeteroRegressor(nn.Module):
    def __init__(self, d, h):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(d, h), nn.SiLU(), nn.Linear(h, h), nn.SiLU())
        self.head = nn.Linear(h, 2)          # mean and log-variance

    def forward(self, x):
        mu, log_var = self.head(self.body(x)).unbind(-1)
        return mu, log_var.clamp(-4, 4)

    def training_loss(self, x, y, denom):
        mu, log_var = self(x)
        nll = 0.5 * (log_var + (y - mu) ** 2 / log_var.exp())
        return nll.sum() / denom


def shard(rank, epoch, cfg):
    g = torch.Generator().manual_seed(cfg["seed"] * 100 + epoch * 10 + rank)
    w_true = torch.linspace(-1, 1, cfg["in_dim"])
    out = []
    for i in range(cfg["windows_per_epoch"] * cfg["K"]):
        n = SIZES[rank][i % len(SIZES[rank])]
        x = torch.randn(n, cfg["in_dim"], generator=g)
        y = x @ w_true + (0.1 + x[:, 0].abs()) * torch.randn(n, generator=g)
        out.append((x, y))
    return out


def build(fabric, cfg):
    model = HeteroRegressor(cfg["in_dim"], cfg["hidden"])
    opt_body = torch.optim.AdamW(model.body.parameters(), lr=cfg["lr_body"], weight_decay=0.01)
    opt_head = torch.optim.SGD(model.head.parameters(), lr=cfg["lr_head"], momentum=0.9)
    model, opt_body, opt_head = fabric.setup(model, opt_body, opt_head)
    model.mark_forward_method("training_loss")
    total = cfg["windows_per_epoch"] * cfg["epochs"]
    sched = torch.optim.lr_scheduler.LambdaLR(opt_body, lambda s: 1.0 - 0.8 * s / total)
    return model, opt_body, opt_head, sched


def run_epoch(fabric, cfg, epoch, model, opt_body, opt_head, sched):
    data = shard(fabric.global_rank, epoch, cfg)
    K, W = cfg["K"], fabric.world_size
    for start in range(0, len(data), K):
        window = data[start:start + K]
        count = fabric.all_reduce(torch.tensor(float(sum(len(y) for _, y in window))), reduce_op="sum")
        for j, (x, y) in enumerate(window):
            last = j == len(window) - 1
            with fabric.no_backward_sync(model, enabled=not last):
                loss = model.training_loss(x, y, count) * W
                fabric.backward(loss)
        opt_body.step()
        opt_head.step()
        opt_body.zero_grad()
        opt_head.zero_grad()
        sched.step()


def param_digest(module):
    h = hashlib.sha256()
    for _, p in module.named_parameters():
        h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def main():
    cfg = dict(SETTINGS)
    torch.set_num_threads(1)
    fabric = Fabric(accelerator="cpu", devices=2, strategy="ddp")
    fabric.launch()
    fabric.seed_everything(cfg["seed"])
    model, opt_body, opt_head, sched = build(fabric, cfg)
    run_epoch(fabric, cfg, 0, model, opt_body, opt_head, sched)
    fabric.save(cfg["ckpt"], {"model": model, "opt_body": opt_body, "opt_head": opt_head,
                              "sched": sched, "epoch": 0})
    fabric.barrier()

    # resume into fresh objects
    fabric.seed_everything(cfg["seed"] + 1)
    model, opt_body, opt_head, sched = build(fabric, cfg)
    state = {"model": model, "opt_body": opt_body, "opt_head": opt_head, "sched": sched, "epoch": -1}
    fabric.load(cfg["ckpt"], state)
    for epoch in range(state["epoch"] + 1, cfg["epochs"]):
        run_epoch(fabric, cfg, epoch, model, opt_body, opt_head, sched)

    if fabric.global_rank == 0:
        print("FINAL_SHA256", param_digest(model))


if __name__ == "__main__":
    main()
