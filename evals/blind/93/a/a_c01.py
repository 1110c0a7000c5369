"""Lightning DDP: bag-of-tokens classifier, frozen pretrained-style embedding, two AdamW groups,
accumulate_grad_batches=3 with norm clipping, a warm-up/decay LambdaLR per optimizer step, and a
checkpoint after epoch 1 that a fresh Trainer resumes from."""
import hashlib
import math
import os

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset
import pytorch_lightning as pl

HERE = os.path.dirname(os.path.abspath(__file__))
CKPT = os.path.join(HERE, "tmp_scratch", "a_c01_epoch1.ckpt")

HP = dict(vocab=50, emb=16, hidden=32, n_cls=4, lr_body=3e-3, lr_head=1e-2,
          micro_bs=4, accum=3, epochs=2, n_samples=96, warmup=2)
# 96 samples / 2 ranks / 4 per micro-batch = 12 micro-batches per rank per epoch = 4 updates per epoch
HP["total_updates"] = HP["epochs"] * (HP["n_samples"] // (2 * HP["micro_bs"])) // HP["accum"]


def make_loader():
    g = torch.Generator().manual_seed(5)
    toks = torch.randint(0, HP["vocab"], (HP["n_samples"], 10), generator=g)
    y = (toks % HP["n_cls"]).float().mean(1).round().long().clamp(max=HP["n_cls"] - 1)
    return DataLoader(TensorDataset(toks, y), batch_size=HP["micro_bs"], shuffle=False)


class BagClassifier(pl.LightningModule):
    def __init__(self, **hp):
        super().__init__()
        self.save_hyperparameters(hp)
        torch.manual_seed(0)
        self.emb = nn.Embedding(hp["vocab"], hp["emb"])
        self.emb.weight.requires_grad_(False)
        self.body = nn.Sequential(nn.Linear(hp["emb"], hp["hidden"]), nn.Tanh())
        self.head = nn.Linear(hp["hidden"], hp["n_cls"])

    def forward(self, toks):
        return self.head(self.body(self.emb(toks).mean(1)))

    def training_step(self, batch, batch_idx):
        toks, y = batch
        return F.cross_entropy(self(toks), y)

    def configure_optimizers(self):
        hp = self.hparams
        opt = torch.optim.AdamW([
            {"params": self.body.parameters(), "lr": hp.lr_body, "weight_decay": 0.05},
            {"params": self.head.parameters(), "lr": hp.lr_head, "weight_decay": 0.0},
        ])

        def lr_lambda(step):
            if step < hp.warmup:
                return (step + 1) / hp.warmup
            frac = (step - hp.warmup) / max(1, hp.total_updates - hp.warmup)
            return 0.5 * (1 + math.cos(math.pi * min(1.0, frac)))

        sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def make_trainer(max_epochs):
    return pl.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=max_epochs,
                      accumulate_grad_batches=HP["accum"], gradient_clip_val=0.5,
                      gradient_clip_algorithm="norm", deterministic=True, logger=False,
                      enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)


def main():
    pl.seed_everything(0, workers=True)
    first = make_trainer(max_epochs=1)
    first.fit(BagClassifier(**HP), make_loader())
    first.save_checkpoint(CKPT)

    model = BagClassifier(**HP)
    second = make_trainer(max_epochs=HP["epochs"])
    second.fit(model, make_loader(), ckpt_path=CKPT)

    if second.global_rank == 0:
        h = hashlib.sha256()
        for _, p in model.named_parameters():
            h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}")


if __name__ == "__main__":
    main()
