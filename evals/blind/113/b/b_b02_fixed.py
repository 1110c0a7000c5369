"""Transfer learning with Lightning's BackboneFinetuning callback on 2 DDP ranks.

The head trains alone for the first epoch; the callback unfreezes the backbone at
epoch 1 with a tenth of the head's learning rate. Lightning accumulates K = 2
micro-batches per optimizer step.
"""
import argparse
import hashlib
import os

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset
import pytorch_lightning as pl
from pytorch_lightning.callbacks import BackboneFinetuning


def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("--seed", type=int, default=2024)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--accumulate", type=int, default=2)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--unfreeze-at", type=int, default=1)
    return p.parse_args()


def make_data(seed, n=64, d=16, classes=5):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g)
    w = torch.randn(d, classes, generator=g)
    y = (x @ w + 0.3 * torch.randn(n, classes, generator=g)).argmax(-1)
    return TensorDataset(x, y)


class FeatureClassifier(pl.LightningModule):
    def __init__(self, lr, d=16, hidden=32, classes=5):
        super().__init__()
        self.save_hyperparameters()
        self.backbone = nn.Sequential(nn.Linear(d, hidden), nn.GELU(), nn.Linear(hidden, hidden), nn.GELU())
        self.head = nn.Linear(hidden, classes)

    def forward(self, x):
        return self.head(self.backbone(x))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.cross_entropy(self(x), y)

    def configure_optimizers(self):
        # the backbone's parameter group is added by BackboneFinetuning
        return torch.optim.AdamW(self.head.parameters(), lr=self.hparams.lr, weight_decay=0.01)


class BackboneFinetuningAfterWrap(BackboneFinetuning):
    # freeze once the strategy has wrapped the model, so DDP registers the backbone too
    def setup(self, trainer, pl_module, stage):
        pass

    def on_fit_start(self, trainer, pl_module):
        self.freeze_before_training(pl_module)
        super().on_fit_start(trainer, pl_module)


def params_sha256(module):
    h = hashlib.sha256()
    for _, p in module.named_parameters():
        h.update(p.detach().to(torch.float32).contiguous().cpu().numpy().tobytes())
    return h.hexdigest()


def main():
    args = parse_args()
    pl.seed_everything(args.seed, workers=True)
    model = FeatureClassifier(lr=args.lr)
    loader = DataLoader(make_data(args.seed), batch_size=args.batch_size, shuffle=True)

    finetuning = BackboneFinetuningAfterWrap(unfreeze_backbone_at_epoch=args.unfreeze_at,
                                            lambda_func=lambda epoch: 1.5, backbone_initial_ratio_lr=0.1)
    trainer = pl.Trainer(
        accelerator="cpu", devices=2, strategy="ddp_find_unused_parameters_true",
        max_epochs=args.epochs, accumulate_grad_batches=args.accumulate,
        callbacks=[finetuning], deterministic=True, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
    )
    trainer.fit(model, loader)

    if os.environ.get("PARAM_DUMP") and trainer.global_rank == 0:
        torch.save({n: p.detach().clone() for n, p in model.named_parameters()}, os.environ["PARAM_DUMP"])
    if trainer.global_rank == 0:
        print(f"FINAL_SHA256 {params_sha256(model)}", flush=True)


if __name__ == "__main__":
    main()
