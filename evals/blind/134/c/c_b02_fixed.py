"""Knowledge distillation with PyTorch Lightning on 2 CPU DDP ranks.

A frozen teacher MLP provides soft targets; the student is trained on
alpha * KL(student || teacher, T) + (1 - alpha) * CE, with OneCycle LR per
optimizer step and gradient accumulation through the Trainer.
"""
import argparse
import hashlib

import pytorch_lightning as pl
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset


def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("--num-samples", type=int, default=384)
    p.add_argument("--in-dim", type=int, default=24)
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--accumulate", type=int, default=4)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--max-lr", type=float, default=5e-2)
    p.add_argument("--temperature", type=float, default=2.0)
    p.add_argument("--alpha", type=float, default=0.7)
    p.add_argument("--seed", type=int, default=17)
    return p.parse_args()


class SyntheticDataModule(pl.LightningDataModule):
    def __init__(self, args):
        super().__init__()
        self.args = args

    def setup(self, stage=None):
        g = torch.Generator().manual_seed(0)
        x = torch.randn(self.args.num_samples, self.args.in_dim, generator=g)
        w = torch.randn(self.args.in_dim, self.args.classes, generator=g)
        y = (x @ w + 0.5 * torch.randn(self.args.num_samples, self.args.classes, generator=g)).argmax(-1)
        self.train_set = TensorDataset(x, y)

    def train_dataloader(self):
        return DataLoader(self.train_set, batch_size=self.args.batch_size, shuffle=True)


def mlp(i, h, o):
    return nn.Sequential(nn.Linear(i, h), nn.ReLU(), nn.Linear(h, h), nn.ReLU(), nn.Linear(h, o))


class Distiller(pl.LightningModule):
    def __init__(self, args):
        super().__init__()
        self.args = args
        self.student = mlp(args.in_dim, 32, args.classes)
        self.teacher = mlp(args.in_dim, 64, args.classes)
        self.teacher.requires_grad_(False)
        self.teacher.eval()

    def training_step(self, batch, batch_idx):
        x, y = batch
        s_logits = self.student(x)
        with torch.no_grad():
            t_logits = self.teacher(x)
        T = self.args.temperature
        kd = F.kl_div(F.log_softmax(s_logits / T, -1), F.softmax(t_logits / T, -1),
                      reduction="batchmean") * T * T
        ce = F.cross_entropy(s_logits, y)
        loss = self.args.alpha * kd + (1 - self.args.alpha) * ce
        self.log("train_loss", loss, prog_bar=False)
        return loss

    def configure_optimizers(self):
        opt = torch.optim.SGD(self.student.parameters(), lr=self.args.max_lr, momentum=0.9)
        sched = torch.optim.lr_scheduler.OneCycleLR(
            opt, max_lr=self.args.max_lr,
            total_steps=self.trainer.estimated_stepping_batches, pct_start=0.25)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def main():
    args = parse_args()
    pl.seed_everything(args.seed, workers=True)
    dm = SyntheticDataModule(args)
    model = Distiller(args)
    trainer = pl.Trainer(
        accelerator="cpu", devices=2, num_nodes=1, strategy="ddp",
        max_epochs=args.epochs, accumulate_grad_batches=args.accumulate,
        deterministic=True, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False,
    )
    trainer.fit(model, datamodule=dm)
    assert trainer.world_size == 2
    h = hashlib.sha256()
    for _, p in model.named_parameters():
        h.update(p.detach().float().contiguous().cpu().numpy().tobytes())
    if trainer.global_rank == 0:
        print(f"global_step {trainer.global_step}")
        print(f"FINAL_SHA256 {h.hexdigest()}")


if __name__ == "__main__":
    main()
