"""Tiny transformer-free char LM (embedding + MLP mixer) trained with PyTorch Lightning.

DDP on 2 CPU ranks, accumulate_grad_batches=3, SGD with momentum and a cosine decay
to zero over the run, stepped with the optimizer.
"""
import hashlib
import math

import pytorch_lightning as pl
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

HPARAMS = dict(vocab=48, ctx=8, dim=32, lr=0.2, momentum=0.9, accumulate_grad_batches=3,
               batch_size=4, batches_per_rank=12, max_epochs=2, seed=11)


class NextTokenMLP(pl.LightningModule):
    def __init__(self, **hp):
        super().__init__()
        self.save_hyperparameters(hp)
        self.emb = nn.Embedding(hp["vocab"], hp["dim"])
        self.mix = nn.Sequential(nn.Linear(hp["ctx"] * hp["dim"], 64), nn.GELU(),
                                 nn.Linear(64, hp["vocab"]))

    def forward(self, x):
        return self.mix(self.emb(x).flatten(1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.cross_entropy(self(x), y)

    def configure_optimizers(self):
        opt = torch.optim.SGD(self.parameters(), lr=self.hparams.lr,
                              momentum=self.hparams.momentum)
        # estimated_stepping_batches counts batches; the scheduler steps once per optimizer step
        total = self.trainer.estimated_stepping_batches // self.hparams.accumulate_grad_batches
        sched = torch.optim.lr_scheduler.LambdaLR(
            opt, lambda s: 0.5 * (1 + math.cos(math.pi * min(s, total) / total)))
        return {"optimizer": opt,
                "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def make_data(hp):
    g = torch.Generator().manual_seed(hp["seed"])
    n = 2 * hp["batch_size"] * hp["batches_per_rank"]
    stream = torch.randint(0, hp["vocab"], (n + hp["ctx"],), generator=g)
    # a learnable rule: next token = (sum of the context) mod vocab
    x = torch.stack([stream[i:i + hp["ctx"]] for i in range(n)])
    y = x.sum(1) % hp["vocab"]
    return TensorDataset(x, y)


def main():
    hp = HPARAMS
    pl.seed_everything(hp["seed"])
    model = NextTokenMLP(**hp)
    loader = DataLoader(make_data(hp), batch_size=hp["batch_size"], shuffle=False)
    trainer = pl.Trainer(accelerator="cpu", devices=2, strategy="ddp",
                         max_epochs=hp["max_epochs"],
                         accumulate_grad_batches=hp["accumulate_grad_batches"],
                         logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(model, loader)
    if trainer.global_rank == 0:
        h = hashlib.sha256()
        for _, p in model.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}")


if __name__ == "__main__":
    main()
