"""Lightning manual optimisation: a backbone (AdamW) and a classifier head (SGD) with their own
optimizers, gradients accumulated over K=3 batches by hand, DDP on 2 ranks."""
import argparse
import hashlib

import pytorch_lightning as L
import torch
import torch.nn as nn
import torch.nn.functional as F
from pytorch_lightning.strategies import DDPStrategy
from torch.utils.data import DataLoader, TensorDataset


def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("--accumulate", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=6)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--backbone-lr", type=float, default=1e-3)
    p.add_argument("--head-lr", type=float, default=5e-2)
    p.add_argument("--seed", type=int, default=2024)
    return p.parse_args()


class TwoOptClassifier(L.LightningModule):
    def __init__(self, accumulate, backbone_lr, head_lr):
        super().__init__()
        self.save_hyperparameters()
        self.automatic_optimization = False
        self.backbone = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 32), nn.ReLU())
        self.head = nn.Linear(32, 5)

    def forward(self, x):
        return self.head(self.backbone(x))

    def configure_optimizers(self):
        body = torch.optim.AdamW(self.backbone.parameters(), lr=self.hparams.backbone_lr)
        head = torch.optim.SGD(self.head.parameters(), lr=self.hparams.head_lr, momentum=0.9)
        return [body, head]

    def _is_boundary(self, batch_idx):
        return (batch_idx + 1) % self.hparams.accumulate == 0

    def _step_optimizers(self, batch_idx):
        body_opt, head_opt = self.optimizers()
        if self._is_boundary(batch_idx):
            body_opt.step()
            body_opt.zero_grad()
            head_opt.step()
            head_opt.zero_grad()

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.manual_backward(loss / self.hparams.accumulate)
        self._step_optimizers(batch_idx)
        return loss.detach()


def main():
    args = parse_args()
    L.seed_everything(args.seed, workers=True)
    g = torch.Generator().manual_seed(args.seed)
    n = 2 * args.batch_size * args.accumulate * 5  # 5 updates per epoch on 2 ranks
    x = torch.randn(n, 20, generator=g)
    y = (x[:, :5] + 0.3 * torch.randn(n, 5, generator=g)).argmax(-1)
    loader = DataLoader(TensorDataset(x, y), batch_size=args.batch_size, shuffle=False)

    model = TwoOptClassifier(args.accumulate, args.backbone_lr, args.head_lr)
    trainer = L.Trainer(
        accelerator="cpu",
        devices=2,
        strategy=DDPStrategy(process_group_backend="gloo"),
        max_epochs=args.epochs,
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
