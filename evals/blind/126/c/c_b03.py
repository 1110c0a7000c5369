"""Tiny character LM (nanoGPT-style block) in Lightning, DDP on 2 ranks.

Recipe settings live in a dict (as loaded from a YAML recipe); the accumulation
schedule goes through Lightning's GradientAccumulationScheduler callback and the
one-cycle schedule is sized from `estimated_stepping_batches`.
"""
import hashlib

import torch
import torch.nn as nn
import torch.nn.functional as F
import pytorch_lightning as pl
from pytorch_lightning.callbacks import GradientAccumulationScheduler
from torch.utils.data import DataLoader, TensorDataset

RECIPE = {
    "vocab": 40,
    "block": 16,
    "d_model": 32,
    "n_head": 4,
    "micro_batch": 4,
    "accum_schedule": {0: 4},
    "max_epochs": 2,
    "max_lr": 1e-2,
    "seed": 2024,
}


class Block(nn.Module):
    def __init__(self, d, n_head, block):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, n_head, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))
        self.register_buffer("mask", torch.triu(torch.ones(block, block, dtype=torch.bool), 1), persistent=False)

    def forward(self, x):
        t = x.size(1)
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=self.mask[:t, :t], need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class CharLM(pl.LightningModule):
    def __init__(self, recipe):
        super().__init__()
        self.save_hyperparameters(recipe)
        r = self.hparams
        self.tok = nn.Embedding(r.vocab, r.d_model)
        self.pos = nn.Parameter(torch.zeros(1, r.block, r.d_model))
        self.blocks = nn.Sequential(Block(r.d_model, r.n_head, r.block), Block(r.d_model, r.n_head, r.block))
        self.ln_f = nn.LayerNorm(r.d_model)
        self.head = nn.Linear(r.d_model, r.vocab, bias=False)

    def forward(self, idx):
        x = self.tok(idx) + self.pos[:, : idx.size(1)]
        return self.head(self.ln_f(self.blocks(x)))

    def training_step(self, batch, batch_idx):
        x, y = batch
        logits = self(x)
        loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1))
        self.log("loss", loss.detach())
        return loss

    def configure_optimizers(self):
        opt = torch.optim.AdamW(self.parameters(), lr=self.hparams.max_lr, betas=(0.9, 0.95), weight_decay=0.1)
        total = self.trainer.estimated_stepping_batches
        sched = torch.optim.lr_scheduler.OneCycleLR(
            opt, max_lr=self.hparams.max_lr, total_steps=total, pct_start=0.25, anneal_strategy="cos"
        )
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def make_corpus(recipe, n_seq=128):
    g = torch.Generator().manual_seed(recipe["seed"])
    # a noisy periodic source so there is something to learn
    start = torch.randint(0, recipe["vocab"], (n_seq, 1), generator=g)
    step = torch.randint(1, 4, (n_seq, 1), generator=g)
    seq = (start + step * torch.arange(recipe["block"] + 1)) % recipe["vocab"]
    noise = torch.rand(seq.shape, generator=g) < 0.1
    seq = torch.where(noise, torch.randint(0, recipe["vocab"], seq.shape, generator=g), seq)
    return TensorDataset(seq[:, :-1].contiguous(), seq[:, 1:].contiguous())


def build_trainer(recipe):
    callbacks = [GradientAccumulationScheduler(scheduling=dict(recipe["accum_schedule"]))]
    return pl.Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        max_epochs=recipe["max_epochs"],
        callbacks=callbacks,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        deterministic=True,
    )


def main():
    pl.seed_everything(RECIPE["seed"], workers=True)
    model = CharLM(RECIPE)
    loader = DataLoader(make_corpus(RECIPE), batch_size=RECIPE["micro_batch"], shuffle=False)
    trainer = build_trainer(RECIPE)
    trainer.fit(model, train_dataloaders=loader)
    if trainer.global_rank == 0:
        flat = torch.cat([p.detach().float().reshape(-1).cpu() for _, p in model.named_parameters()])
        print(f"FINAL_SHA256 {hashlib.sha256(flat.numpy().tobytes()).hexdigest()}", flush=True)


if __name__ == "__main__":
    main()
