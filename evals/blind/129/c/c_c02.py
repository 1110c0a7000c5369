"""Lightning DDP (2 CPU ranks) sentiment-ish classifier, accumulate_grad_batches=4.

Unusual but legal bits:
- the pretrained-style embedding table is frozen;
- AdamW with two parameter groups (encoder vs. head, different LR / decay);
- gradient clipping via a configure_gradient_clipping override that only clips
  the head's gradient norm (small threshold, so it acts);
- OneCycleLR stepped per optimizer step, horizon from estimated_stepping_batches;
- the DataLoader runs a worker process.
"""
import hashlib
from types import SimpleNamespace

import torch
import torch.nn as nn
import torch.nn.functional as F
import pytorch_lightning as pl
from torch.utils.data import DataLoader, Dataset

HP = SimpleNamespace(vocab=150, seq_len=20, emb=24, hidden=48, n_classes=3,
                     n_samples=384, batch_size=8, accumulate=4, epochs=2,
                     lr_enc=5e-3, lr_head=2e-2, head_clip=0.05, seed=31)


class SyntheticReviews(Dataset):
    def __init__(self, hp):
        g = torch.Generator().manual_seed(hp.seed)
        self.x = torch.randint(0, hp.vocab, (hp.n_samples, hp.seq_len), generator=g)
        self.y = (self.x[:, 0] + self.x[:, -1]) % hp.n_classes

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


class Classifier(pl.LightningModule):
    def __init__(self, hp):
        super().__init__()
        self.hp = hp
        self.embed = nn.Embedding(hp.vocab, hp.emb)
        self.embed.weight.requires_grad_(False)
        self.encoder = nn.Sequential(nn.Linear(hp.emb, hp.hidden), nn.GELU(),
                                     nn.Linear(hp.hidden, hp.hidden), nn.GELU())
        self.head = nn.Linear(hp.hidden, hp.n_classes)

    def forward(self, x):
        return self.head(self.encoder(self.embed(x).mean(1)))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.cross_entropy(self(x), y)

    def configure_optimizers(self):
        opt = torch.optim.AdamW([
            {"params": self.encoder.parameters(), "lr": self.hp.lr_enc, "weight_decay": 0.05},
            {"params": self.head.parameters(), "lr": self.hp.lr_head, "weight_decay": 0.0},
        ])
        sched = torch.optim.lr_scheduler.OneCycleLR(
            opt, max_lr=[self.hp.lr_enc, self.hp.lr_head],
            total_steps=self.trainer.estimated_stepping_batches, pct_start=0.25)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    def configure_gradient_clipping(self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None):
        torch.nn.utils.clip_grad_norm_(self.head.parameters(), max_norm=self.hp.head_clip)


def param_sha(model):
    h = hashlib.sha256()
    for _, p in model.named_parameters():
        h.update(p.detach().to(torch.float32).contiguous().numpy().tobytes())
    return h.hexdigest()


def main():
    pl.seed_everything(HP.seed, workers=True)
    model = Classifier(HP)
    loader = DataLoader(SyntheticReviews(HP), batch_size=HP.batch_size, shuffle=True,
                        num_workers=1, persistent_workers=True)
    trainer = pl.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=HP.epochs,
                         accumulate_grad_batches=HP.accumulate, deterministic=True,
                         logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False)
    trainer.fit(model, loader)
    sha = param_sha(model)
    if trainer.global_rank == 0:
        print(f"FINAL_SHA256 {sha}")


if __name__ == "__main__":
    main()
