"""Response-level distillation of a small tagger into a smaller student, Lightning DDP.

The teacher is a frozen, randomly initialised MLP (stand-in for a fine-tuned checkpoint);
the student learns from hard labels plus the teacher's temperature-softened distribution.
Effective batch = micro_batch * accumulate * world_size.
"""
import hashlib
import os
from dataclasses import dataclass, field

import torch
import torch.nn as nn
import torch.nn.functional as F
import pytorch_lightning as pl
from pytorch_lightning.callbacks import GradientAccumulationScheduler
from torch.utils.data import DataLoader, TensorDataset


@dataclass
class DistillConfig:
    in_dim: int = 24
    n_classes: int = 7
    teacher_hidden: int = 96
    student_hidden: int = 32
    micro_batch: int = 4
    accumulate: int = 4            # micro-batches per optimizer step
    # GradientAccumulationScheduler wants {epoch: factor}; epochs are numbered from 1
    # (its own error message says "Epochs indexing from 1"), so start at epoch 1.
    accumulate_from_epoch: int = 1
    epochs: int = 2
    n_train: int = 128             # 16 micro-batches per rank per epoch on 2 ranks
    lr: float = 3e-3
    temperature: float = 2.0
    alpha: float = 0.5
    seed: int = 1234
    betas: tuple = field(default=(0.9, 0.98))


def mlp(d_in, d_h, d_out):
    return nn.Sequential(nn.Linear(d_in, d_h), nn.GELU(), nn.Linear(d_h, d_h), nn.GELU(), nn.Linear(d_h, d_out))


class DistillModule(pl.LightningModule):
    def __init__(self, cfg: DistillConfig):
        super().__init__()
        self.cfg = cfg
        self.teacher = mlp(cfg.in_dim, cfg.teacher_hidden, cfg.n_classes)
        self.teacher.requires_grad_(False)
        self.student = mlp(cfg.in_dim, cfg.student_hidden, cfg.n_classes)

    def training_step(self, batch, batch_idx):
        x, y = batch
        with torch.no_grad():
            t_logits = self.teacher(x)
        s_logits = self.student(x)
        T = self.cfg.temperature
        kd = F.kl_div(F.log_softmax(s_logits / T, -1), F.softmax(t_logits / T, -1), reduction="batchmean") * T * T
        ce = F.cross_entropy(s_logits, y)
        loss = self.cfg.alpha * kd + (1 - self.cfg.alpha) * ce
        self.log("train/loss", loss, prog_bar=False)
        return loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.student.parameters(), lr=self.cfg.lr, betas=self.cfg.betas, weight_decay=0.01)


def make_data(cfg):
    g = torch.Generator().manual_seed(cfg.seed)
    x = torch.randn(cfg.n_train, cfg.in_dim, generator=g)
    w = torch.randn(cfg.in_dim, cfg.n_classes, generator=g)
    y = (x @ w + 0.3 * torch.randn(cfg.n_train, cfg.n_classes, generator=g)).argmax(-1)
    return TensorDataset(x, y)


def param_sha(module):
    h = hashlib.sha256()
    for _, p in module.named_parameters():
        h.update(p.detach().to(torch.float32).contiguous().cpu().numpy().tobytes())
    return h.hexdigest()


def main():
    cfg = DistillConfig()
    pl.seed_everything(cfg.seed, workers=True)
    model = DistillModule(cfg)
    loader = DataLoader(make_data(cfg), batch_size=cfg.micro_batch, shuffle=False)
    accum = GradientAccumulationScheduler(scheduling={cfg.accumulate_from_epoch: cfg.accumulate})
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        max_epochs=cfg.epochs,
        callbacks=[accum],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        deterministic=True,
    )
    trainer.fit(model, loader)
    if trainer.global_rank == 0:
        print(f"optimizer steps: {trainer.global_step}")
        print(f"FINAL_SHA256 {param_sha(model)}")


if __name__ == "__main__":
    main()
