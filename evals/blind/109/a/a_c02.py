"""Lightning automatic optimisation under bf16-mixed with an EMA callback.

- accumulate_grad_batches=3, each epoch is a whole number of windows (9 batches per rank)
- the input projection is frozen (a fixed random-feature layer)
- gradient clipping by norm, OneCycleLR stepped per optimizer step
- a worker DataLoader
- an EMA of the weights kept by a callback that only updates after real optimizer steps
"""
import argparse
import copy
import hashlib

import torch
import torch.nn as nn
import torch.nn.functional as F
import pytorch_lightning as pl
from pytorch_lightning.callbacks import Callback
from torch.utils.data import DataLoader, Dataset


class Waves(Dataset):
    def __init__(self, n=216, d=20, seed=21):
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, d, generator=g)
        self.y = torch.sin(self.x[:, :5].sum(-1)) + 0.5 * self.x[:, 5]

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


class EMACallback(Callback):
    def __init__(self, decay=0.9):
        self.decay = decay
        self.ema = None
        self._seen_step = 0

    def on_fit_start(self, trainer, pl_module):
        self.ema = copy.deepcopy(pl_module).eval()
        for p in self.ema.parameters():
            p.requires_grad_(False)

    @torch.no_grad()
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step == self._seen_step:      # still accumulating
            return
        self._seen_step = trainer.global_step
        for e, p in zip(self.ema.parameters(), pl_module.parameters()):
            e.lerp_(p.detach(), 1 - self.decay)


class RFRegressor(pl.LightningModule):
    def __init__(self, d_in=20, d_feat=64, lr=2e-2):
        super().__init__()
        self.save_hyperparameters()
        self.features = nn.Linear(d_in, d_feat)
        self.features.requires_grad_(False)
        self.net = nn.Sequential(nn.Linear(d_feat, 32), nn.SiLU(), nn.Linear(32, 1))

    def forward(self, x):
        return self.net(torch.cos(self.features(x))).squeeze(-1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.mse_loss(self(x).float(), y)

    def configure_optimizers(self):
        opt = torch.optim.AdamW([p for p in self.parameters() if p.requires_grad], lr=self.hparams.lr)
        sched = torch.optim.lr_scheduler.OneCycleLR(
            opt, max_lr=self.hparams.lr, total_steps=int(self.trainer.estimated_stepping_batches))
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--accumulate-grad-batches", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=12)
    ap.add_argument("--max-epochs", type=int, default=3)
    ap.add_argument("--dump", default="")
    args = ap.parse_args()

    pl.seed_everything(17, workers=True)
    model = RFRegressor()
    loader = DataLoader(Waves(), batch_size=args.batch_size, shuffle=True, num_workers=1,
                        persistent_workers=True, generator=torch.Generator().manual_seed(2))
    ema = EMACallback()
    trainer = pl.Trainer(accelerator="cpu", devices=2, strategy="ddp", precision="bf16-mixed",
                         max_epochs=args.max_epochs, accumulate_grad_batches=args.accumulate_grad_batches,
                         gradient_clip_val=0.5, gradient_clip_algorithm="norm", callbacks=[ema],
                         logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, deterministic=True)
    trainer.fit(model, train_dataloaders=loader)
    if trainer.global_rank == 0:
        if args.dump:
            torch.save({n: p.detach().clone() for n, p in model.named_parameters()}, args.dump)
        h = hashlib.sha256()
        for _, p in model.named_parameters():
            h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)


if __name__ == "__main__":
    main()
