"""Session-based next-item recommender (bag of recent items -> next item), Lightning automatic
optimisation with accumulate_grad_batches, bf16-mixed autocast and DDP on two CPU ranks.

The item table is by far the largest tensor, so it is kept in the autocast dtype to halve its
memory; the tower and the output layer stay fp32 (autocast handles the casts).
"""
import hashlib
import os
from dataclasses import dataclass, field

os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("MASTER_PORT", "49206")

import torch
import torch.nn as nn
import torch.nn.functional as F
import pytorch_lightning as pl
from torch.utils.data import DataLoader, Dataset


@dataclass
class RecConfig:
    n_items: int = 600
    n_cats: int = 12
    dim: int = 32
    history: int = 10
    table_dtype: torch.dtype = torch.float32
    lr: float = 3e-3
    warmup_steps: int = 4
    micro_batch: int = 8
    accumulate: int = 4
    epochs: int = 3
    n_sessions: int = 512
    clip: float = 1.0
    seed: int = 99
    trainer_kwargs: dict = field(default_factory=lambda: dict(
        accelerator="cpu", devices=2, strategy="ddp", precision="bf16-mixed"))


class Sessions(Dataset):
    def __init__(self, cfg):
        g = torch.Generator().manual_seed(cfg.seed)
        cat_of_item = torch.randint(0, cfg.n_cats, (cfg.n_items,), generator=g)
        items_by_cat = [torch.nonzero(cat_of_item == c).flatten() for c in range(cfg.n_cats)]
        self.hist, self.target = [], []
        for _ in range(cfg.n_sessions):
            c = int(torch.randint(0, cfg.n_cats, (1,), generator=g))
            pool = items_by_cat[c]
            seq = pool[torch.randint(0, len(pool), (cfg.history + 1,), generator=g)]
            self.hist.append(seq[:-1])
            self.target.append(seq[-1])

    def __len__(self):
        return len(self.hist)

    def __getitem__(self, i):
        return self.hist[i], self.target[i]


class NextItem(pl.LightningModule):
    def __init__(self, cfg: RecConfig):
        super().__init__()
        self.cfg = cfg
        self.item_table = nn.Embedding(cfg.n_items, cfg.dim, dtype=cfg.table_dtype)
        nn.init.normal_(self.item_table.weight, std=0.5)
        self.pos = nn.Parameter(torch.zeros(cfg.history, cfg.dim))
        self.tower = nn.Sequential(nn.Linear(cfg.dim, 64), nn.GELU(), nn.Linear(64, cfg.dim))
        self.out = nn.Linear(cfg.dim, cfg.n_items)

    def forward(self, hist):
        e = self.item_table(hist).float() + self.pos
        return self.out(self.tower(e.mean(dim=1)))

    def training_step(self, batch, batch_idx):
        hist, target = batch
        loss = F.cross_entropy(self(hist).float(), target)
        self.log("loss", loss, sync_dist=False)
        return loss

    def configure_optimizers(self):
        opt = torch.optim.AdamW(self.parameters(), lr=self.cfg.lr, weight_decay=0.0)
        total = self.trainer.estimated_stepping_batches
        w = self.cfg.warmup_steps
        sched = torch.optim.lr_scheduler.LambdaLR(
            opt, lambda s: min(1.0, (s + 1) / w) * max(0.05, 1.0 - s / total))
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def param_digest(module):
    h = hashlib.sha256()
    for _, p in module.named_parameters():
        h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def main():
    cfg = RecConfig()
    torch.set_num_threads(1)
    pl.seed_everything(cfg.seed, workers=True)
    model = NextItem(cfg)
    loader = DataLoader(Sessions(cfg), batch_size=cfg.micro_batch, shuffle=False)
    trainer = pl.Trainer(**cfg.trainer_kwargs, max_epochs=cfg.epochs,
                         accumulate_grad_batches=cfg.accumulate, gradient_clip_val=cfg.clip,
                         logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, deterministic=True)
    trainer.fit(model, loader)
    if trainer.is_global_zero:
        print("FINAL_SHA256", param_digest(model))


if __name__ == "__main__":
    main()
