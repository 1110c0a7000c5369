"""Fine-tune a small classifier with L2-SP regularisation (Li et al. 2018).

The backbone is pulled towards its "pretrained" starting point, the fresh head
towards zero.  The regulariser is applied straight to the gradients, so the
loss we log stays the plain task loss.
"""
import argparse
import hashlib

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset
import pytorch_lightning as pl


def build_args():
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--micro-batch", type=int, default=8)
    p.add_argument("--accumulate", type=int, default=4)
    p.add_argument("--lr", type=float, default=3e-2)
    p.add_argument("--alpha-sp", type=float, default=0.05, help="pull towards the starting point")
    p.add_argument("--beta-head", type=float, default=0.02, help="L2 on the new head")
    p.add_argument("--seed", type=int, default=1234)
    return p.parse_args()


def synthetic_data(n=768, d=24, classes=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g)
    w = torch.randn(d, classes, generator=g)
    y = (x @ w + 0.3 * torch.randn(n, classes, generator=g)).argmax(-1)
    return TensorDataset(x, y)


class L2SPClassifier(pl.LightningModule):
    def __init__(self, d_in=24, hidden=64, classes=5, lr=3e-2, alpha_sp=0.05, beta_head=0.02):
        super().__init__()
        self.save_hyperparameters()
        self.backbone = nn.Sequential(
            nn.Linear(d_in, hidden), nn.GELU(), nn.Linear(hidden, hidden), nn.GELU()
        )
        self.head = nn.Linear(hidden, classes)
        # snapshot of the starting ("pretrained") backbone
        self._anchor = [p.detach().clone() for p in self.backbone.parameters()]

    def forward(self, x):
        return self.head(self.backbone(x))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log("train/ce", loss, prog_bar=False)
        return loss

    def on_after_backward(self):
        # L2-SP: d/dw [alpha/2 ||w - w0||^2] = alpha (w - w0); head: beta w
        a, b = self.hparams.alpha_sp, self.hparams.beta_head
        for p, p0 in zip(self.backbone.parameters(), self._anchor):
            if p.grad is not None:
                p.grad.add_(p.detach() - p0.to(p.device), alpha=a)
        for p in self.head.parameters():
            if p.grad is not None:
                p.grad.add_(p.detach(), alpha=b)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=0.9)


def main():
    args = build_args()
    pl.seed_everything(args.seed, workers=True)
    model = L2SPClassifier(lr=args.lr, alpha_sp=args.alpha_sp, beta_head=args.beta_head)
    # move away from the anchor a little so the pull is visible from step one
    with torch.no_grad():
        g = torch.Generator().manual_seed(7)
        for p in model.backbone.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))

    loader = DataLoader(synthetic_data(), batch_size=args.micro_batch, shuffle=False)
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        max_epochs=args.epochs,
        accumulate_grad_batches=args.accumulate,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        deterministic=True,
    )
    trainer.fit(model, loader)

    if trainer.global_rank == 0:
        h = hashlib.sha256()
        for _, p in model.named_parameters():
            h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)


if __name__ == "__main__":
    main()
