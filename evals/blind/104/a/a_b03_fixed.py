"""Tabular click-through model trained with PyTorch Lightning DDP on 2 CPU ranks.

Lightning accumulates 3 micro-batches per optimizer step; the global gradient
norm of each update is clipped to `clip_norm`.
"""
import hashlib
import os

import pytorch_lightning as pl
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

HPARAMS = dict(n_cat=40, emb_dim=8, n_num=12, hidden=48, lr=2e-3, wd=0.01,
               clip_norm=0.05, batch_size=8, accumulate=3, epochs=3, seed=2024)


def make_dataset(n_cat, n_num, seed, n=288):
    g = torch.Generator().manual_seed(seed)
    cat = torch.randint(0, n_cat, (n, 3), generator=g)
    num = torch.randn(n, n_num, generator=g)
    w = torch.randn(n_num, generator=g)
    logit = num @ w + 0.3 * (cat[:, 0] % 5).float() - 0.2 * (cat[:, 1] % 3).float()
    y = (torch.sigmoid(logit) > torch.rand(n, generator=g)).float()
    return TensorDataset(cat, num, y)


class CTRModel(pl.LightningModule):
    def __init__(self, **hp):
        super().__init__()
        self.save_hyperparameters(hp)
        self.emb = nn.Embedding(hp["n_cat"], hp["emb_dim"])
        self.mlp = nn.Sequential(
            nn.Linear(3 * hp["emb_dim"] + hp["n_num"], hp["hidden"]), nn.GELU(),
            nn.Linear(hp["hidden"], hp["hidden"]), nn.GELU(),
            nn.Linear(hp["hidden"], 1),
        )

    def forward(self, cat, num):
        x = torch.cat([self.emb(cat).flatten(1), num], dim=1)
        return self.mlp(x).squeeze(-1)

    def training_step(self, batch, batch_idx):
        cat, num, y = batch
        loss = F.binary_cross_entropy_with_logits(self(cat, num), y)
        return loss

    def on_before_optimizer_step(self, optimizer):
        # keep the update bounded: clip the global gradient norm
        torch.nn.utils.clip_grad_norm_(self.parameters(), self.hparams.clip_norm)

    def configure_optimizers(self):
        return torch.optim.AdamW(
            [
                {"params": self.mlp.parameters(), "weight_decay": self.hparams.wd},
                {"params": self.emb.parameters(), "weight_decay": 0.0},
            ],
            lr=self.hparams.lr,
        )

    def train_dataloader(self):
        ds = make_dataset(self.hparams.n_cat, self.hparams.n_num, self.hparams.seed)
        return DataLoader(ds, batch_size=self.hparams.batch_size, shuffle=True)


def main():
    pl.seed_everything(HPARAMS["seed"], workers=True)
    model = CTRModel(**HPARAMS)
    trainer = pl.Trainer(
        accelerator="cpu", devices=2, strategy="ddp", max_epochs=HPARAMS["epochs"],
        accumulate_grad_batches=HPARAMS["accumulate"], deterministic=True,
        logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=os.path.join(os.path.dirname(os.path.abspath(__file__)), "tmp_scratch", "a_b03"),
    )
    trainer.fit(model)
    if trainer.global_rank == 0:
        h = hashlib.sha256()
        for _, p in model.named_parameters():
            h.update(p.detach().float().contiguous().cpu().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)


if __name__ == "__main__":
    main()
