"""Lightning automatic optimisation on 2 CPU DDP ranks: a small sequence tagger.

accumulate_grad_batches=2, bf16-mixed autocast, a frozen pretrained-style embedding,
two parameter groups, a per-step StepLR and a norm clip at 0.3.
"""
import hashlib
import os

os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("MASTER_PORT", "49241")

import torch
import torch.nn as nn
import torch.nn.functional as F
import pytorch_lightning as pl
from torch.utils.data import DataLoader, TensorDataset

HP = dict(vocab=50, dim=32, tags=7, seq=12, batch=4, n=128, accum=2, epochs=2, lr=2e-3, clip=0.3, seed=5)


class Tagger(pl.LightningModule):
    def __init__(self, hp):
        super().__init__()
        self.hp = hp
        self.emb = nn.Embedding(hp["vocab"], hp["dim"])
        self.emb.weight.requires_grad_(False)
        self.conv = nn.Conv1d(hp["dim"], hp["dim"], 3, padding=1)
        self.norm = nn.LayerNorm(hp["dim"])
        self.out = nn.Linear(hp["dim"], hp["tags"])

    def forward(self, ids):
        h = self.emb(ids)
        h = h + F.gelu(self.conv(h.transpose(1, 2)).transpose(1, 2))
        return self.out(self.norm(h))

    def training_step(self, batch, batch_idx):
        ids, tags = batch
        logits = self(ids)
        return F.cross_entropy(logits.float().reshape(-1, self.hp["tags"]), tags.reshape(-1))

    def configure_optimizers(self):
        decay = [p for n, p in self.named_parameters() if p.requires_grad and n.endswith("weight") and "norm" not in n]
        rest = [p for n, p in self.named_parameters() if p.requires_grad and not (n.endswith("weight") and "norm" not in n)]
        opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.05},
                                 {"params": rest, "weight_decay": 0.0}], lr=self.hp["lr"])
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=4, gamma=0.7)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def loader(hp):
    g = torch.Generator().manual_seed(hp["seed"] + 100)
    ids = torch.randint(0, hp["vocab"], (hp["n"], hp["seq"]), generator=g)
    tags = (ids * 3 + torch.roll(ids, 1, dims=1)) % hp["tags"]
    return DataLoader(TensorDataset(ids, tags), batch_size=hp["batch"], shuffle=False,
                      num_workers=1, drop_last=True)


class FinalHash(pl.Callback):
    def on_train_end(self, trainer, pl_module):
        if trainer.is_global_zero:
            named = list(pl_module.named_parameters())
            flat = torch.cat([p.detach().float().reshape(-1) for _, p in named])
            print("FINAL_SHA256", hashlib.sha256(flat.numpy().tobytes()).hexdigest(), flush=True)


if __name__ == "__main__":
    pl.seed_everything(HP["seed"], verbose=False)
    model = Tagger(HP)
    trainer = pl.Trainer(accelerator="cpu", devices=2, strategy="ddp", precision="bf16-mixed",
                         max_epochs=HP["epochs"], accumulate_grad_batches=HP["accum"],
                         gradient_clip_val=HP["clip"], gradient_clip_algorithm="norm",
                         logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, deterministic=True, callbacks=[FinalHash()])
    trainer.fit(model, train_dataloaders=loader(HP))
