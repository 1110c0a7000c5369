"""Lightning text classifier under bf16-mixed with K = 3 on 2 DDP ranks.

Frozen token embedding, AdamW with a no-decay group for biases and norms, a linear
warm-up/decay schedule over the optimizer steps Lightning estimates, clipping at 0.05,
and a DataLoader with a worker process. 12 batches per rank per epoch, so every window
is full.
"""
import hashlib

import pytorch_lightning as pl
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset


class Config:
    vocab = 40
    seq = 10
    dim = 24
    classes = 4
    batch_size = 4
    per_rank_batches = 12
    accumulate = 3
    epochs = 2
    lr = 4e-3
    weight_decay = 0.1
    warmup = 2
    clip = 0.05
    seed = 3


class SynthText(Dataset):
    def __init__(self, cfg):
        g = torch.Generator().manual_seed(cfg.seed)
        n = 2 * cfg.batch_size * cfg.per_rank_batches
        self.x = torch.randint(0, cfg.vocab, (n, cfg.seq), generator=g)
        self.y = (self.x[:, :3].sum(1) % cfg.classes)

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


class Classifier(pl.LightningModule):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.tok = nn.Embedding(cfg.vocab, cfg.dim)
        self.tok.weight.requires_grad_(False)
        self.norm = nn.LayerNorm(cfg.dim)
        self.ff = nn.Sequential(nn.Linear(cfg.dim, 48), nn.GELU(), nn.Linear(48, cfg.dim))
        self.out = nn.Linear(cfg.dim, cfg.classes)

    def forward(self, x):
        h = self.tok(x)
        h = h + self.ff(self.norm(h))
        return self.out(h.mean(1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.cross_entropy(self(x).float(), y)

    def configure_optimizers(self):
        decay, no_decay = [], []
        for n, p in self.named_parameters():
            if not p.requires_grad:
                continue
            (no_decay if p.ndim < 2 else decay).append(p)
        opt = torch.optim.AdamW([{"params": decay, "weight_decay": self.cfg.weight_decay},
                                 {"params": no_decay, "weight_decay": 0.0}], lr=self.cfg.lr)
        total = self.trainer.estimated_stepping_batches
        warm = self.cfg.warmup

        def lr_lambda(s):
            if s < warm:
                return (s + 1) / warm
            return max(0.0, (total - s) / max(1, total - warm))

        sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda)
        return [opt], [{"scheduler": sched, "interval": "step"}]


def main():
    cfg = Config()
    pl.seed_everything(cfg.seed)
    model = Classifier(cfg)
    loader = DataLoader(SynthText(cfg), batch_size=cfg.batch_size, shuffle=False,
                        num_workers=1, persistent_workers=True)
    trainer = pl.Trainer(accelerator="cpu", devices=2, strategy="ddp", precision="bf16-mixed",
                         max_epochs=cfg.epochs, accumulate_grad_batches=cfg.accumulate,
                         gradient_clip_val=cfg.clip, gradient_clip_algorithm="norm",
                         logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, deterministic=True)
    trainer.fit(model, loader)
    if trainer.global_rank == 0:
        h = hashlib.sha256()
        for _, p in model.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}")


if __name__ == "__main__":
    main()
