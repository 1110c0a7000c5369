"""Lightning (automatic optimisation) on 2 DDP ranks with accumulate_grad_batches=3.

Unusual but legal: a frozen positional table, two AdamW parameter groups with different LRs,
gradient_clip_val=0.5 (acts), OneCycleLR per optimizer step from estimated_stepping_batches,
and a callback that logs the gradient norm right before each optimizer step.
"""
import hashlib
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset
import pytorch_lightning as pl


@dataclass
class HParams:
    n_feat: int = 12
    seq: int = 6
    width: int = 24
    n_classes: int = 4
    batch_size: int = 3
    accumulate: int = 3
    epochs: int = 2
    lr_body: float = 4e-3
    lr_head: float = 1e-2
    n_samples: int = 54


class SeqClassifier(pl.LightningModule):
    def __init__(self, hp: HParams):
        super().__init__()
        self.hp = hp
        self.inp = nn.Linear(hp.n_feat, hp.width)
        self.pos = nn.Parameter(torch.randn(hp.seq, hp.width) * 0.1, requires_grad=False)
        self.block = nn.Sequential(nn.LayerNorm(hp.width), nn.Linear(hp.width, hp.width), nn.SiLU())
        self.head = nn.Linear(hp.width, hp.n_classes)

    def forward(self, x):
        h = self.inp(x) + self.pos
        h = h + self.block(h)
        return self.head(h.mean(dim=1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log("train_loss", loss, prog_bar=False)
        return loss

    def configure_optimizers(self):
        body = [p for n, p in self.named_parameters() if p.requires_grad and not n.startswith("head.")]
        head = list(self.head.parameters())
        opt = torch.optim.AdamW([{"params": body, "lr": self.hp.lr_body},
                                 {"params": head, "lr": self.hp.lr_head, "weight_decay": 0.0}],
                                weight_decay=0.05)
        sched = torch.optim.lr_scheduler.OneCycleLR(
            opt, max_lr=[self.hp.lr_body, self.hp.lr_head],
            total_steps=self.trainer.estimated_stepping_batches, pct_start=0.3)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


class GradNormLogger(pl.Callback):
    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        norms = [p.grad.norm() for p in pl_module.parameters() if p.grad is not None]
        pl_module.log("grad_norm_preclip", torch.stack(norms).norm())


def sha_of(model):
    h = hashlib.sha256()
    for _, p in model.named_parameters():
        h.update(p.detach().float().contiguous().cpu().numpy().tobytes())
    return h.hexdigest()


def main():
    hp = HParams()
    pl.seed_everything(3, workers=True)
    g = torch.Generator().manual_seed(3)
    x = torch.randn(hp.n_samples, hp.seq, hp.n_feat, generator=g)
    y = (x[:, :, 0].sum(dim=1) > 0).long() + 2 * (x[:, 0, 1] > 0).long()
    loader = DataLoader(TensorDataset(x, y), batch_size=hp.batch_size, shuffle=True)
    model = SeqClassifier(hp)
    trainer = pl.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=hp.epochs,
                         accumulate_grad_batches=hp.accumulate, gradient_clip_val=0.5,
                         callbacks=[GradNormLogger()], logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, deterministic=True)
    trainer.fit(model, loader)
    if trainer.global_rank == 0:
        print(f"optimizer steps {trainer.global_step}")
        print("FINAL_SHA256", sha_of(model))


if __name__ == "__main__":
    main()
