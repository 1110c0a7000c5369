"""Multi-class classifier, Lightning automatic optimisation with accumulate_grad_batches=4 on
epochs of 10 micro-batches per rank (windows 4-4-2), a clip that acts, a frozen random
projection, two parameter groups, and a resume by a fresh Trainer from an epoch-end checkpoint.

Lightning divides every micro-batch's loss by accumulate_grad_batches, also in the epoch's short
last window; ``training_step`` rescales by K / (size of this micro-batch's window) so that the
2-batch tail is the mean over its own 2 micro-batches.
"""
import argparse
import hashlib
import os
import tempfile

os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("MASTER_PORT", "49213")

import torch
import torch.nn as nn
import torch.nn.functional as F
import pytorch_lightning as pl
from torch.utils.data import DataLoader, TensorDataset


def parse():
    p = argparse.ArgumentParser()
    p.add_argument("--accumulate", type=int, default=4)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--n-samples", type=int, default=80)   # 10 micro-batches per rank
    p.add_argument("--first-epochs", type=int, default=1)
    p.add_argument("--max-epochs", type=int, default=3)
    p.add_argument("--clip", type=float, default=0.5)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=21)
    return p.parse_args()


class Classifier(pl.LightningModule):
    def __init__(self, lr=0.05, in_dim=16, n_cls=5):
        super().__init__()
        self.save_hyperparameters()
        self.proj = nn.Linear(in_dim, 32, bias=False)
        self.proj.requires_grad_(False)
        self.mlp = nn.Sequential(nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh())
        self.cls = nn.Linear(32, n_cls)

    def forward(self, x):
        return self.cls(self.mlp(self.proj(x)))

    def _window_size(self, batch_idx):
        k = self.trainer.accumulate_grad_batches
        n = self.trainer.num_training_batches
        start = (batch_idx // k) * k
        return min(k, n - start)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        scale = self.trainer.accumulate_grad_batches / self._window_size(batch_idx)
        return loss * scale

    def configure_optimizers(self):
        opt = torch.optim.SGD([
            {"params": self.mlp.parameters(), "lr": self.hparams.lr},
            {"params": self.cls.parameters(), "lr": 2 * self.hparams.lr, "weight_decay": 1e-3},
        ], lr=self.hparams.lr, momentum=0.9)
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=3 * 3, eta_min=0.005)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def make_loader(args):
    g = torch.Generator().manual_seed(args.seed)
    x = torch.randn(args.n_samples, 16, generator=g)
    y = (x[:, :5] * torch.arange(1, 6)).argmax(dim=1)
    return DataLoader(TensorDataset(x, y), batch_size=args.batch_size, shuffle=False)


def make_trainer(args, max_epochs):
    return pl.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=max_epochs,
                      accumulate_grad_batches=args.accumulate, gradient_clip_val=args.clip,
                      logger=False, enable_checkpointing=False, enable_progress_bar=False,
                      enable_model_summary=False, deterministic=True)


def param_digest(module):
    h = hashlib.sha256()
    for _, p in module.named_parameters():
        h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def main():
    args = parse()
    torch.set_num_threads(1)
    ckpt = os.path.join(tempfile.gettempdir(), "c_c03_epoch_end_49213.ckpt")
    pl.seed_everything(args.seed)
    model = Classifier(lr=args.lr)
    trainer = make_trainer(args, args.first_epochs)
    trainer.fit(model, make_loader(args))
    trainer.save_checkpoint(ckpt)
    trainer.strategy.barrier()

    pl.seed_everything(args.seed + 1)
    model = Classifier(lr=args.lr)          # fresh weights, overwritten by the checkpoint
    trainer = make_trainer(args, args.max_epochs)
    trainer.fit(model, make_loader(args), ckpt_path=ckpt)
    if trainer.is_global_zero:
        print("FINAL_SHA256", param_digest(model))


if __name__ == "__main__":
    main()
