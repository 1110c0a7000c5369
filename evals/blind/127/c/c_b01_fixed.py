"""Distil a small teacher MLP into a student with a learned softmax temperature.

Lightning DDP on 2 CPU ranks, accumulate_grad_batches=2.
"""
import hashlib
import os
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
import pytorch_lightning as pl
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


@dataclass
class KDConfig:
    in_dim: int = 32
    hidden: int = 64
    n_classes: int = 10
    n_samples: int = 128
    micro_batch: int = 4
    grad_accum: int = 2
    epochs: int = 2
    lr: float = 0.05
    tau_lr: float = 0.5
    init_tau: float = 2.0
    alpha: float = 0.7
    seed: int = 1234


def make_data(cfg):
    g = torch.Generator().manual_seed(cfg.seed)
    x = torch.randn(cfg.n_samples, cfg.in_dim, generator=g)
    y = torch.randint(0, cfg.n_classes, (cfg.n_samples,), generator=g)
    return TensorDataset(x, y)


class Distiller(pl.LightningModule):
    def __init__(self, cfg: KDConfig):
        super().__init__()
        self.cfg = cfg
        torch.manual_seed(cfg.seed)
        self.teacher = nn.Sequential(nn.Linear(cfg.in_dim, 128), nn.Tanh(), nn.Linear(128, cfg.n_classes))
        self.teacher.requires_grad_(False)
        self.student = nn.Sequential(nn.Linear(cfg.in_dim, cfg.hidden), nn.GELU(), nn.Linear(cfg.hidden, cfg.n_classes))
        self.log_tau = nn.Parameter(torch.tensor(float(cfg.init_tau)).log())

    def temperature(self):
        return self.log_tau.exp()

    def training_step(self, batch, batch_idx):
        x, y = batch
        with torch.no_grad():
            t_logits = self.teacher(x)
        s_logits = self.student(x)
        tau = self.temperature()
        kd = F.kl_div(F.log_softmax(s_logits / tau, -1), F.log_softmax(t_logits / tau, -1),
                      reduction="batchmean", log_target=True) * tau * tau
        ce = F.cross_entropy(s_logits, y)
        return self.cfg.alpha * kd + (1 - self.cfg.alpha) * ce

    def configure_optimizers(self):
        # the temperature lives next to its own (faster) param group
        return torch.optim.SGD(
            [
                {"params": self.student.parameters(), "lr": self.cfg.lr},
                {"params": [self.log_tau], "lr": self.cfg.tau_lr},
            ],
            momentum=0.9,
        )


def main():
    cfg = KDConfig()
    pl.seed_everything(cfg.seed, workers=True)
    torch.use_deterministic_algorithms(True)
    model = Distiller(cfg)
    ds = make_data(cfg)
    world, rank = int(os.environ["WORLD_SIZE"]), int(os.environ["RANK"])
    sampler = DistributedSampler(ds, num_replicas=world, rank=rank, shuffle=False)
    loader = DataLoader(ds, batch_size=cfg.micro_batch, sampler=sampler)
    trainer = pl.Trainer(
        accelerator="cpu", devices=2, num_nodes=1, strategy="ddp",
        accumulate_grad_batches=cfg.grad_accum, max_epochs=cfg.epochs,
        logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, deterministic=True, use_distributed_sampler=False,
    )
    trainer.fit(model, loader)
    if trainer.global_rank == 0:
        h = hashlib.sha256()
        for _, p in model.named_parameters():
            h.update(p.detach().float().contiguous().cpu().numpy().tobytes())
        print("FINAL_SHA256", h.hexdigest(), flush=True)


if __name__ == "__main__":
    main()
