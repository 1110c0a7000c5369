"""Tagging model with Lightning (automatic optimisation), DDP on 2 CPU ranks.

accumulate_grad_batches = 2 over epochs of 12 batches per rank; two AdamW parameter
groups, a per-step OneCycle schedule sized from estimated_stepping_batches, a gradient
clip that acts, a frozen character CNN, and a tag vocabulary grown in configure_model
(before the strategy wraps the model) with the output layer tied to the tag embedding.
"""
import hashlib

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

import pytorch_lightning as pl

WORDS, TAGS_OLD, TAGS_NEW, D, T = 40, 6, 9, 32, 10


class Tagger(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.word = nn.Embedding(WORDS, D)
        self.char_cnn = nn.Conv1d(D, D, 3, padding=1)
        self.char_cnn.requires_grad_(False)          # frozen, pretrained in real life
        self.enc = nn.LSTM(D, D, batch_first=True, bidirectional=True)
        self.proj = nn.Linear(2 * D, D)
        self.tag_emb = nn.Embedding(TAGS_OLD, D)
        self.out = nn.Linear(D, TAGS_OLD, bias=False)
        self.out.weight = self.tag_emb.weight

    def configure_model(self):
        # new tags were added to the label set: grow the table, keep the old rows
        if self.tag_emb.num_embeddings == TAGS_NEW:
            return
        g = torch.Generator().manual_seed(11)
        new = nn.Embedding(TAGS_NEW, D)
        with torch.no_grad():
            new.weight[:TAGS_OLD] = self.tag_emb.weight
            new.weight[TAGS_OLD:] = 0.02 * torch.randn(TAGS_NEW - TAGS_OLD, D, generator=g)
        self.tag_emb = new
        self.out = nn.Linear(D, TAGS_NEW, bias=False)
        self.out.weight = self.tag_emb.weight

    def forward(self, w):
        e = self.word(w)
        e = e + self.char_cnn(e.transpose(1, 2)).transpose(1, 2)
        h, _ = self.enc(e)
        return self.out(torch.tanh(self.proj(h)))

    def training_step(self, batch, batch_idx):
        w, y = batch
        return F.cross_entropy(self(w).reshape(-1, TAGS_NEW), y.reshape(-1))

    def configure_optimizers(self):
        emb = [self.word.weight, self.tag_emb.weight]
        emb_ids = {id(p) for p in emb}
        rest = [p for p in self.parameters() if p.requires_grad and id(p) not in emb_ids]
        opt = torch.optim.AdamW([
            {"params": rest, "lr": 4e-3, "weight_decay": 0.05},
            {"params": emb, "lr": 8e-3, "weight_decay": 0.0},
        ])
        sched = torch.optim.lr_scheduler.OneCycleLR(
            opt, max_lr=[4e-3, 8e-3], total_steps=self.trainer.estimated_stepping_batches,
            pct_start=0.25)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def dataset():
    g = torch.Generator().manual_seed(3)
    n = 2 * 12 * 4
    w = torch.randint(0, WORDS, (n, T), generator=g)
    y = (w * 7 + torch.roll(w, 1, dims=1)) % TAGS_NEW
    return TensorDataset(w, y)


def sha(m):
    h = hashlib.sha256()
    for _, p in m.named_parameters():
        h.update(p.detach().float().contiguous().cpu().numpy().tobytes())
    return h.hexdigest()


def main():
    pl.seed_everything(0)
    torch.use_deterministic_algorithms(True)
    model = Tagger()
    loader = DataLoader(dataset(), batch_size=4, shuffle=True,
                        generator=torch.Generator().manual_seed(0))
    trainer = pl.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=3,
                         accumulate_grad_batches=2, gradient_clip_val=0.25,
                         gradient_clip_algorithm="norm", logger=False,
                         enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, deterministic=True)
    trainer.fit(model, loader)
    if trainer.global_rank == 0:
        print(f"FINAL_SHA256 {sha(model)}", flush=True)


if __name__ == "__main__":
    main()
