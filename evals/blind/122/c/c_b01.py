"""Multi-teacher feature distillation (FitNets-style hints) with PyTorch Lightning.

Two frozen teachers give hint features; the student learns one projector per
teacher plus a classification head. Gradient accumulation is left to the Trainer.
"""
import hashlib
import os
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
import pytorch_lightning as pl
from torch.utils.data import DataLoader, TensorDataset


@dataclass
class DistillConfig:
    in_dim: int = 24
    hid: int = 32
    n_cls: int = 5
    teacher_dims: tuple = (("wide", 48), ("deep", 16))
    hint_weight: float = 0.5
    lr: float = 3e-3
    micro_bs: int = 4
    accumulate: int = 3
    epochs: int = 2
    n_samples: int = 96  # 12 micro-batches per rank per epoch


def make_teacher(in_dim, out_dim):
    t = nn.Sequential(nn.Linear(in_dim, 64), nn.Tanh(), nn.Linear(64, out_dim))
    t.requires_grad_(False)
    return t.eval()


class HintDistiller(pl.LightningModule):
    def __init__(self, cfg: DistillConfig):
        super().__init__()
        self.cfg = cfg
        self.student = nn.Sequential(
            nn.Linear(cfg.in_dim, cfg.hid), nn.GELU(), nn.Linear(cfg.hid, cfg.hid), nn.GELU()
        )
        self.classifier = nn.Linear(cfg.hid, cfg.n_cls)
        self.teachers = nn.ModuleDict({n: make_teacher(cfg.in_dim, d) for n, d in cfg.teacher_dims})
        # one hint projector per teacher
        self.projectors = {n: nn.Linear(cfg.hid, d) for n, d in cfg.teacher_dims}

    def training_step(self, batch, batch_idx):
        x, y = batch
        h = self.student(x)
        loss = F.cross_entropy(self.classifier(h), y)
        for name, teacher in self.teachers.items():
            with torch.no_grad():
                target = teacher(x)
            loss = loss + self.cfg.hint_weight * F.mse_loss(self.projectors[name](h), target)
        return loss

    def configure_optimizers(self):
        params = list(self.student.parameters()) + list(self.classifier.parameters())
        for proj in self.projectors.values():
            params += list(proj.parameters())
        return torch.optim.AdamW(params, lr=self.cfg.lr, weight_decay=0.01)


def main():
    cfg = DistillConfig()
    pl.seed_everything(1234, workers=True)
    g = torch.Generator().manual_seed(7)
    x = torch.randn(cfg.n_samples, cfg.in_dim, generator=g)
    y = torch.randint(0, cfg.n_cls, (cfg.n_samples,), generator=g)
    loader = DataLoader(TensorDataset(x, y), batch_size=cfg.micro_bs, shuffle=False)

    model = HintDistiller(cfg)
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        max_epochs=cfg.epochs,
        accumulate_grad_batches=cfg.accumulate,
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
            h.update(p.detach().float().contiguous().numpy().tobytes())
        print("FINAL_SHA256", h.hexdigest(), flush=True)
        os.makedirs("tmp_scratch", exist_ok=True)
        torch.save({n: p.detach().clone() for n, p in model.named_parameters()},
                   os.path.join("tmp_scratch", os.path.basename(__file__) + ".pt"))


if __name__ == "__main__":
    main()
