"""Lightning manual optimisation: a body on AdamW + cosine and a head on SGD-momentum,
a frozen input projection, ragged micro-batches and 3-3-2 windows, 2 DDP ranks.

Each epoch is 8 micro-batches per rank and K = 3, so every epoch ends with a 2-batch
window. The loss of a window is the mean over all samples the window saw on all ranks;
the plan of micro-batch sizes is shared (same seed on every rank), so the window's
global count is known up front.
"""
import hashlib
import math
import os
from contextlib import nullcontext
from types import SimpleNamespace

import pytorch_lightning as pl
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

HP = SimpleNamespace(in_dim=12, hidden=40, n_cls=5, per_rank=8, K=3, epochs=3,
                     lr_body=3e-3, lr_head=5e-2, clip=0.5, seed=21)


class SharedPlan(Dataset):
    def __init__(self, rank, world):
        g = torch.Generator().manual_seed(HP.seed)
        w_true = torch.randn(HP.in_dim, HP.n_cls, generator=g)
        plan = []  # plan[step][rank] = micro-batch
        for _ in range(HP.per_rank):
            row = []
            for _r in range(world):
                n = int(torch.randint(2, 9, (1,), generator=g))
                x = torch.randn(n, HP.in_dim, generator=g)
                y = (x @ w_true + 0.3 * torch.randn(n, HP.n_cls, generator=g)).argmax(-1)
                row.append((x, y))
            plan.append(row)
        self.items = []
        for w0 in range(0, HP.per_rank, HP.K):
            steps = list(range(w0, min(w0 + HP.K, HP.per_rank)))
            n_global = sum(plan[s][r][0].shape[0] for s in steps for r in range(world))
            for j, s in enumerate(steps):
                x, y = plan[s][rank]
                self.items.append({"x": x, "y": y, "n_global": torch.tensor(float(n_global)),
                                   "last": torch.tensor(j == len(steps) - 1)})

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]


class Classifier(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.automatic_optimization = False
        self.proj = nn.Linear(HP.in_dim, HP.hidden)
        self.proj.requires_grad_(False)  # fixed random features
        self.body = nn.Sequential(nn.Linear(HP.hidden, HP.hidden), nn.Tanh(),
                                  nn.Linear(HP.hidden, HP.hidden), nn.Tanh())
        self.head = nn.Linear(HP.hidden, HP.n_cls)

    def forward(self, x):
        return self.head(self.body(self.proj(x)))

    def training_step(self, batch, batch_idx):
        opt_body, opt_head = self.optimizers()
        sched = self.lr_schedulers()
        last = bool(batch["last"])
        world = self.trainer.world_size
        ctx = nullcontext() if last else self.trainer.strategy.block_backward_sync()
        with ctx:
            logits = self(batch["x"])
            loss = F.cross_entropy(logits, batch["y"], reduction="sum") * world / batch["n_global"]
            self.manual_backward(loss)
        if last:
            self.clip_gradients(opt_body, gradient_clip_val=HP.clip, gradient_clip_algorithm="norm")
            opt_body.step()
            opt_head.step()
            opt_body.zero_grad()
            opt_head.zero_grad()
            sched.step()

    def configure_optimizers(self):
        opt_body = torch.optim.AdamW(self.body.parameters(), lr=HP.lr_body, weight_decay=0.01)
        opt_head = torch.optim.SGD(self.head.parameters(), lr=HP.lr_head, momentum=0.9, nesterov=True)
        total = HP.epochs * math.ceil(HP.per_rank / HP.K)
        sched = torch.optim.lr_scheduler.LambdaLR(
            opt_body, lambda s: 0.5 * (1 + math.cos(math.pi * min(s, total) / total)))
        return [opt_body, opt_head], [sched]

    def train_dataloader(self):
        return DataLoader(SharedPlan(self.global_rank, self.trainer.world_size),
                          batch_size=None, shuffle=False)


def main():
    pl.seed_everything(HP.seed)
    model = Classifier()
    trainer = pl.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=HP.epochs,
                         use_distributed_sampler=False, deterministic=True, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False)
    trainer.fit(model)
    if trainer.global_rank == 0:
        h = hashlib.sha256()
        for _, p in model.named_parameters():
            h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)


if __name__ == "__main__":
    main()
