"""Knowledge distillation with Lightning manual optimisation on 2 CPU DDP ranks.

Teacher is frozen; student learns from soft targets + hard labels.  Accumulates
`accum` micro-batches per optimizer step by hand (manual optimisation).
"""
import hashlib
import os
from dataclasses import dataclass

os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("MASTER_PORT", "49212")

import torch
import torch.nn as nn
import torch.nn.functional as F
import pytorch_lightning as pl
from torch.utils.data import DataLoader, TensorDataset


@dataclass
class KDConfig:
    in_dim: int = 24
    n_classes: int = 10
    hidden: int = 48
    temperature: float = 2.0
    alpha: float = 0.7
    lr: float = 2e-3
    accum: int = 3
    batch_size: int = 4
    n_samples: int = 144     # 72 per rank -> 18 micro-batches -> 6 steps per epoch
    epochs: int = 2
    seed: int = 11


def mlp(i, h, o):
    return nn.Sequential(nn.Linear(i, h), nn.ReLU(), nn.Linear(h, h), nn.ReLU(), nn.Linear(h, o))


class DistillModule(pl.LightningModule):
    def __init__(self, cfg: KDConfig):
        super().__init__()
        self.cfg = cfg
        self.automatic_optimization = False
        torch.manual_seed(cfg.seed)
        self.student = mlp(cfg.in_dim, cfg.hidden, cfg.n_classes)
        teacher = mlp(cfg.in_dim, cfg.hidden * 2, cfg.n_classes)
        for p in teacher.parameters():
            p.requires_grad_(False)
        teacher.eval()
        # keep the teacher out of the module tree: it is not trained and not saved
        self.__dict__["teacher"] = teacher

    def kd_loss(self, x, y):
        T = self.cfg.temperature
        s_logits = self.student(x)
        with torch.no_grad():
            t_logits = self.teacher(x)
        soft = F.kl_div(F.log_softmax(s_logits / T, -1), F.softmax(t_logits / T, -1),
                        reduction="batchmean") * T * T
        hard = F.cross_entropy(s_logits, y)
        return self.cfg.alpha * soft + (1 - self.cfg.alpha) * hard

    def training_step(self, batch, batch_idx):
        opt = self.optimizers()
        x, y = batch
        loss = self.kd_loss(x, y) / self.cfg.accum
        self.manual_backward(loss)
        if (batch_idx + 1) % self.cfg.accum == 0:
            opt.step()
            opt.zero_grad()
        return loss.detach()

    def configure_optimizers(self):
        return torch.optim.Adam(self.student.parameters(), lr=self.cfg.lr)


def make_loader(cfg):
    g = torch.Generator().manual_seed(cfg.seed + 1)
    x = torch.randn(cfg.n_samples, cfg.in_dim, generator=g)
    y = torch.randint(0, cfg.n_classes, (cfg.n_samples,), generator=g)
    return DataLoader(TensorDataset(x, y), batch_size=cfg.batch_size, shuffle=False)


class ShaCallback(pl.Callback):
    def on_train_end(self, trainer, pl_module):
        if trainer.global_rank == 0:
            params = [p.detach().float().reshape(-1) for _, p in pl_module.named_parameters()]
            flat = torch.cat(params)
            print("FINAL_SHA256", hashlib.sha256(flat.numpy().tobytes()).hexdigest(), flush=True)
            if os.environ.get("PARAM_DUMP"):
                torch.save({n: p.detach().clone() for n, p in pl_module.named_parameters()}, os.environ["PARAM_DUMP"])


def main():
    cfg = KDConfig()
    pl.seed_everything(cfg.seed, verbose=False)
    module = DistillModule(cfg)
    trainer = pl.Trainer(
        accelerator="cpu", devices=2, strategy="ddp", max_epochs=cfg.epochs,
        logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, deterministic=True, callbacks=[ShaCallback()],
    )
    trainer.fit(module, train_dataloaders=make_loader(cfg))


if __name__ == "__main__":
    main()
