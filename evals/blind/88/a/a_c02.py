"""Classification with the Lightning Trainer on 2 DDP ranks (torchrun), accumulate_grad_batches=3,
bf16-mixed autocast, a frozen input projection, norm clipping at 0.25 and a per-update OneCycleLR."""
import hashlib

import torch
import torch.nn as nn
import pytorch_lightning as pl
from torch.utils.data import DataLoader, TensorDataset

SEED, K, BS, EPOCHS = 5, 3, 6, 2


class Classifier(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(20, 48)
        self.proj.requires_grad_(False)  # fixed random features
        self.body = nn.Sequential(nn.GELU(), nn.Linear(48, 48), nn.GELU(), nn.Linear(48, 5))

    def forward(self, x):
        return self.body(self.proj(x))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.cross_entropy(self(x), y)

    def configure_optimizers(self):
        opt = torch.optim.AdamW([p for p in self.parameters() if p.requires_grad], lr=5e-3, weight_decay=0.05)
        sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=5e-3,
                                                    total_steps=int(self.trainer.estimated_stepping_batches))
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def main():
    pl.seed_everything(SEED, workers=True)
    g = torch.Generator().manual_seed(SEED)
    x = torch.randn(432, 20, generator=g)
    y = (x[:, :5] * 3).argmax(-1)
    # 432 rows / 2 ranks / 6 per batch = 36 batches per rank = 12 full windows of 3
    loader = DataLoader(TensorDataset(x, y), batch_size=BS, shuffle=True)
    model = Classifier()
    trainer = pl.Trainer(accelerator="cpu", devices=2, strategy="ddp", precision="bf16-mixed",
                         max_epochs=EPOCHS, accumulate_grad_batches=K, gradient_clip_val=0.25,
                         gradient_clip_algorithm="norm", deterministic=True, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(model, loader)
    if trainer.is_global_zero:
        flat = torch.cat([p.detach().float().reshape(-1) for _, p in model.named_parameters()])
        print("FINAL_SHA256", hashlib.sha256(flat.numpy().tobytes()).hexdigest(), flush=True)


if __name__ == "__main__":
    main()
