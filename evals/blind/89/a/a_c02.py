# Lightning DDP classifier: K=3, bf16-mixed autocast, a frozen input projection, gradient clipping by
# the Trainer, OneCycleLR sized from estimated_stepping_batches, a DataLoader with a worker process
import hashlib

import pytorch_lightning as pl
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

CONFIG = dict(accumulate=3, batch_size=6, epochs=2, n_samples=360, max_lr=0.02, clip=0.25)


class Classifier(pl.LightningModule):
    def __init__(self, max_lr):
        super().__init__()
        self.save_hyperparameters()
        self.proj = nn.Linear(20, 48)
        self.proj.requires_grad_(False)
        self.body = nn.Sequential(nn.GELU(), nn.Linear(48, 48), nn.LayerNorm(48), nn.GELU(), nn.Linear(48, 5))

    def forward(self, x):
        return self.body(self.proj(x))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.cross_entropy(self(x).float(), y)

    def configure_optimizers(self):
        params = [p for p in self.parameters() if p.requires_grad]
        opt = torch.optim.AdamW(params, lr=self.hparams.max_lr, weight_decay=0.01)
        sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=self.hparams.max_lr,
                                                    total_steps=self.trainer.estimated_stepping_batches)
        return [opt], [{"scheduler": sched, "interval": "step"}]


def dataset(n):
    g = torch.Generator().manual_seed(21)
    x = torch.randn(n, 20, generator=g)
    y = (x[:, :5].argmax(dim=1) + (x[:, 5] > 1).long()) % 5
    return TensorDataset(x, y)


def main():
    pl.seed_everything(5, workers=True)
    model = Classifier(CONFIG["max_lr"])
    loader = DataLoader(dataset(CONFIG["n_samples"]), batch_size=CONFIG["batch_size"], shuffle=True,
                        num_workers=1, persistent_workers=True, generator=torch.Generator().manual_seed(5))
    trainer = pl.Trainer(accelerator="cpu", devices=2, strategy="ddp", precision="bf16-mixed",
                         max_epochs=CONFIG["epochs"], accumulate_grad_batches=CONFIG["accumulate"],
                         gradient_clip_val=CONFIG["clip"], gradient_clip_algorithm="norm", deterministic=True,
                         logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False)
    trainer.fit(model, loader)
    if trainer.global_rank == 0:
        h = hashlib.sha256()
        for _, p in model.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        print("FINAL_SHA256", h.hexdigest())


if __name__ == "__main__":
    main()
