"""Fabric regression trainer with a shared encoder (AdamW) and a head (SGD + momentum),
per-optimizer gradient clipping at the update, 4-4-2 windows per epoch, and a
checkpoint/resume into freshly built objects between epochs.
"""
import hashlib
import os
import shutil
import tempfile

import torch
import torch.nn as nn
import torch.nn.functional as F
from lightning_fabric import Fabric
from torch.utils.data import DataLoader, TensorDataset

MICRO_BATCH = 5
ACCUM = 4
EPOCHS_BEFORE_RESUME = 1
EPOCHS_TOTAL = 3
CLIP_ENCODER = 0.1
CLIP_HEAD = 0.15
SEED = 99


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(12, 48), nn.SiLU(), nn.Linear(48, 48), nn.SiLU())
        self.head = nn.Linear(48, 3)

    def forward(self, x):
        return self.head(self.encoder(x))


def make_dataset():
    g = torch.Generator().manual_seed(SEED)
    x = torch.randn(100, 12, generator=g)          # 50 per rank -> 10 micro-batches -> windows 4, 4, 2
    w = torch.randn(12, 3, generator=g)
    y = torch.sin(x @ w) + 0.05 * torch.randn(100, 3, generator=g)
    return TensorDataset(x, y)


def build(fabric):
    torch.manual_seed(SEED)
    model = Net()
    opt_enc = torch.optim.AdamW(model.encoder.parameters(), lr=3e-3, weight_decay=0.01)
    opt_head = torch.optim.SGD(model.head.parameters(), lr=5e-2, momentum=0.9)
    model, opt_enc, opt_head = fabric.setup(model, opt_enc, opt_head)
    return model, opt_enc, opt_head


def train_epoch(fabric, model, opt_enc, opt_head, loader, epoch):
    batches = list(loader)
    n = len(batches)
    for start in range(0, n, ACCUM):
        window = batches[start:start + ACCUM]
        for j, (x, y) in enumerate(window):
            last = j == len(window) - 1
            with fabric.no_backward_sync(model, enabled=not last):
                loss = F.mse_loss(model(x), y) / len(window)
                fabric.backward(loss)
        enc_norm = fabric.clip_gradients(model, opt_enc, max_norm=CLIP_ENCODER)
        head_norm = fabric.clip_gradients(model, opt_head, max_norm=CLIP_HEAD)
        opt_enc.step()
        opt_head.step()
        opt_enc.zero_grad()
        opt_head.zero_grad()
        if fabric.global_rank == 0:
            print(f"epoch {epoch} window@{start} size {len(window)} enc_norm {enc_norm:.3f} head_norm {head_norm:.3f}")


def main():
    fabric = Fabric(accelerator="cpu", devices=2, strategy="ddp")
    fabric.launch()
    fabric.seed_everything(SEED)
    loader = fabric.setup_dataloaders(DataLoader(make_dataset(), batch_size=MICRO_BATCH, shuffle=False))

    ckpt_dir = fabric.broadcast(tempfile.mkdtemp(prefix="c_c01_") if fabric.global_rank == 0 else None)
    ckpt = os.path.join(ckpt_dir, "state.ckpt")

    model, opt_enc, opt_head = build(fabric)
    for epoch in range(EPOCHS_BEFORE_RESUME):
        train_epoch(fabric, model, opt_enc, opt_head, loader, epoch)
    fabric.save(ckpt, {"model": model, "opt_enc": opt_enc, "opt_head": opt_head, "epoch": EPOCHS_BEFORE_RESUME})
    fabric.barrier()
    del model, opt_enc, opt_head

    # "preempted": rebuild everything from scratch and restore
    model, opt_enc, opt_head = build(fabric)
    state = {"model": model, "opt_enc": opt_enc, "opt_head": opt_head, "epoch": 0}
    fabric.load(ckpt, state)
    for epoch in range(state["epoch"], EPOCHS_TOTAL):
        train_epoch(fabric, model, opt_enc, opt_head, loader, epoch)

    if fabric.global_rank == 0:
        h = hashlib.sha256()
        for _, p in model.named_parameters():
            h.update(p.detach().to(torch.float32).contiguous().cpu().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}")
    fabric.barrier()
    if fabric.global_rank == 0:
        shutil.rmtree(ckpt_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
