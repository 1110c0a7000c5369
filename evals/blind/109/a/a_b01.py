"""Fine-tune a small regressor with an L2-SP penalty (pull towards the starting weights).

Lightning DDP on CPU, automatic optimisation, gradient accumulation from argparse.
The L2-SP term is applied directly on the gradients so it does not show up in the logged loss.
"""
import argparse
import hashlib
import os

import torch
import torch.nn as nn
import torch.nn.functional as F
import pytorch_lightning as pl
from torch.utils.data import DataLoader, TensorDataset


def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("--accumulate", type=int, default=4)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--lr", type=float, default=1e-2)
    p.add_argument("--l2sp", type=float, default=0.5)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--n-samples", type=int, default=512)
    p.add_argument("--dump", type=str, default="")
    return p.parse_args()


class L2SPRegressor(pl.LightningModule):
    def __init__(self, lr: float, l2sp: float, d_in: int = 16, d_hidden: int = 64):
        super().__init__()
        self.save_hyperparameters()
        self.body = nn.Sequential(nn.Linear(d_in, d_hidden), nn.GELU(), nn.Linear(d_hidden, d_hidden), nn.GELU())
        self.out = nn.Linear(d_hidden, 1)
        self._anchor = {}

    def on_fit_start(self):
        # the "pretrained" starting point the fine-tune is regularised towards
        self._anchor = {n: p.detach().clone() for n, p in self.named_parameters()}

    def forward(self, x):
        return self.out(self.body(x)).squeeze(-1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.mse_loss(self(x), y)
        self.log("train/mse", loss, prog_bar=False)
        return loss

    def on_after_backward(self):
        # d/dp (l2sp/2) * ||p - p0||^2 = l2sp * (p - p0)
        lam = self.hparams.l2sp
        for n, p in self.named_parameters():
            if p.grad is not None:
                p.grad.add_(p.detach() - self._anchor[n], alpha=lam)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=0.9)


def make_data(n, d_in=16, seed=1234):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d_in, generator=g)
    w = torch.randn(d_in, generator=g)
    y = torch.tanh(x @ w) + 0.1 * torch.randn(n, generator=g)
    return TensorDataset(x, y)


def params_sha256(module):
    h = hashlib.sha256()
    for _, p in module.named_parameters():
        h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def main():
    args = parse_args()
    pl.seed_everything(0, workers=True)
    torch.use_deterministic_algorithms(True)
    model = L2SPRegressor(lr=args.lr, l2sp=args.l2sp)
    # move the start away from the anchor quickly: pretend the head is new
    with torch.no_grad():
        model.out.weight.mul_(3.0)
    loader = DataLoader(make_data(args.n_samples), batch_size=args.batch_size, shuffle=True,
                        generator=torch.Generator().manual_seed(7))
    trainer = pl.Trainer(
        accelerator="cpu", devices=2, strategy="ddp", max_epochs=args.epochs,
        accumulate_grad_batches=args.accumulate,
        logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, deterministic=True,
    )
    trainer.fit(model, train_dataloaders=loader)
    if trainer.global_rank == 0:
        if args.dump:
            torch.save({n: p.detach().clone() for n, p in model.named_parameters()}, args.dump)
        print(f"FINAL_SHA256 {params_sha256(model)}", flush=True)


if __name__ == "__main__":
    main()
