"""Lightning automatic optimisation with accumulate_grad_batches=3 on 2 DDP ranks: a frozen
input projection, two parameter groups, a gradient-norm clip that acts, and a warm-up/decay
LambdaLR stepped per optimizer step and sized from estimated_stepping_batches."""
import hashlib

import pytorch_lightning as pl
import torch
import torch.nn as nn
import torch.nn.functional as F
from pytorch_lightning.callbacks import Callback
from pytorch_lightning.strategies import DDPStrategy
from torch.utils.data import DataLoader, Dataset

HPARAMS = dict(accumulate=3, batch_size=5, epochs=3, lr=3e-3, clip=0.4, warmup=2, seed=99)


class Waves(Dataset):
    def __init__(self, n, seed):
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, 10, generator=g)
        freq = torch.randn(10, 2, generator=g)
        self.y = torch.cat([torch.sin(self.x @ freq), torch.cos(self.x @ freq)], dim=1)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


class LrHistory(Callback):
    """Read-only: keeps the learning rate seen after each batch."""

    def __init__(self):
        self.lrs = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.lrs.append(trainer.optimizers[0].param_groups[0]["lr"])


class WaveNetLite(pl.LightningModule):
    def __init__(self, **hp):
        super().__init__()
        self.save_hyperparameters(hp)
        self.proj = nn.Linear(10, 32)
        for p in self.proj.parameters():
            p.requires_grad_(False)  # fixed random features
        self.body = nn.Sequential(nn.Tanh(), nn.Linear(32, 32), nn.Tanh())
        self.out = nn.Linear(32, 4)

    def forward(self, x):
        return self.out(self.body(self.proj(x)))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.smooth_l1_loss(self(x), y, beta=0.5)
        self.log("train_loss", loss, sync_dist=False, prog_bar=False)
        return loss

    def configure_optimizers(self):
        opt = torch.optim.AdamW(
            [
                {"params": self.body.parameters(), "weight_decay": 0.01},
                {"params": self.out.parameters(), "weight_decay": 0.0, "lr": self.hparams.lr * 2},
            ],
            lr=self.hparams.lr,
        )
        total = self.trainer.estimated_stepping_batches
        warm = self.hparams.warmup

        def lr_lambda(step):
            if step < warm:
                return (step + 1) / warm
            return max(0.05, 1.0 - (step - warm) / max(1, total - warm))

        sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step", "frequency": 1}}


def main():
    hp = HPARAMS
    pl.seed_everything(hp["seed"], workers=True)
    ds = Waves(2 * hp["batch_size"] * hp["accumulate"] * 3, hp["seed"])  # 3 updates per epoch
    loader = DataLoader(ds, batch_size=hp["batch_size"], shuffle=False)
    model = WaveNetLite(**hp)
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=2,
        strategy=DDPStrategy(process_group_backend="gloo"),
        max_epochs=hp["epochs"],
        accumulate_grad_batches=hp["accumulate"],
        gradient_clip_val=hp["clip"],
        gradient_clip_algorithm="norm",
        callbacks=[LrHistory()],
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
