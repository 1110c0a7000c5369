"""Lightning Fabric DDP on 2 CPU ranks: a backbone with a frozen embedding table and a head,
set up separately with their own optimizers (AdamW + SGD-Nesterov), K 2 with
`no_backward_sync` around forward and backward, 9-batch epochs (a 1-batch last window
normalised by its own size), a clip on updates and a per-update OneCycle schedule."""
import hashlib
import os

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from lightning_fabric import Fabric
from torch.utils.data import DataLoader, TensorDataset

os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("MASTER_PORT", "49010")

K, MB, EPOCHS = 2, 3, 3
N = 54                                          # 27 per rank -> 9 micro-batches per epoch


class Backbone(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(40, 16)
        self.tok.weight.requires_grad_(False)   # frozen pretrained table
        self.body = nn.Sequential(nn.Linear(16, 32), nn.SiLU(), nn.Linear(32, 32))

    def forward(self, ids):
        return self.body(self.tok(ids)).mean(1)


def windows_per_epoch(n_batches):
    return (n_batches + K - 1) // K


def main():
    fabric = Fabric(accelerator="cpu", devices=2, strategy="ddp")
    fabric.launch()
    fabric.seed_everything(0)
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(0, 40, (N, 8), generator=g)
    y = torch.randn(N, generator=g) + (ids[:, 0] % 5).float()
    loader = fabric.setup_dataloaders(DataLoader(TensorDataset(ids, y), batch_size=MB, shuffle=False))

    backbone, head = Backbone(), nn.Linear(32, 1)
    opt_b = torch.optim.AdamW([p for p in backbone.parameters() if p.requires_grad], lr=2e-3)
    opt_h = torch.optim.SGD(head.parameters(), lr=2e-2, momentum=0.9, nesterov=True)
    total_updates = EPOCHS * windows_per_epoch(len(loader))
    sched = torch.optim.lr_scheduler.OneCycleLR(opt_b, max_lr=4e-3, total_steps=total_updates)
    backbone, opt_b = fabric.setup(backbone, opt_b)
    head, opt_h = fabric.setup(head, opt_h)

    n = len(loader)
    for epoch in range(EPOCHS):
        for i, (x, t) in enumerate(loader):
            start = (i // K) * K
            in_window = min(K, n - start)          # 2, 2, 2, 2, 1
            boundary = (i + 1) % K == 0 or i + 1 == n
            with fabric.no_backward_sync(backbone, enabled=not boundary), \
                    fabric.no_backward_sync(head, enabled=not boundary):
                pred = head(backbone(x)).squeeze(-1)
                loss = F.smooth_l1_loss(pred, t) / in_window
                fabric.backward(loss)
            if boundary:
                fabric.clip_gradients(backbone, opt_b, max_norm=0.4)
                fabric.clip_gradients(head, opt_h, max_norm=0.4)
                opt_b.step()
                opt_h.step()
                sched.step()
                opt_b.zero_grad()
                opt_h.zero_grad()

    if fabric.global_rank == 0:
        h = hashlib.sha256()
        for m in (backbone.module, head.module):
            for _, p in m.named_parameters():
                h.update(p.detach().float().cpu().numpy().astype(np.float32).tobytes())
        print("FINAL_SHA256", h.hexdigest(), flush=True)
    fabric.barrier()


if __name__ == "__main__":
    main()
