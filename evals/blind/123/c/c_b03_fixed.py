"""Logit distillation of a small MLP student from a frozen wider teacher with
Lightning Fabric (DDP on 2 CPU ranks), gradient accumulation by hand.
"""
import argparse
import hashlib

import torch
import torch.nn as nn
import torch.nn.functional as F
from lightning_fabric import Fabric
from torch.utils.data import DataLoader, TensorDataset


def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--accum", type=int, default=4)
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--temperature", type=float, default=2.0)
    p.add_argument("--alpha", type=float, default=0.7)
    p.add_argument("--clip", type=float, default=10.0)
    return p.parse_args()


def mlp(d_in, d_hidden, d_out):
    return nn.Sequential(nn.Linear(d_in, d_hidden), nn.ReLU(), nn.Linear(d_hidden, d_out))


class Distiller:
    def __init__(self, fabric, args):
        self.fabric, self.args = fabric, args
        with torch.random.fork_rng():
            torch.manual_seed(1)
            teacher = mlp(16, 128, 6).eval()
        for p in teacher.parameters():
            p.requires_grad_(False)
        student = mlp(16, 24, 6)
        opt = torch.optim.SGD(student.parameters(), lr=args.lr, momentum=0.9)
        self.student, self.opt = fabric.setup(student, opt)
        self.teacher = teacher.to(fabric.device)

    def kd_loss(self, x, y):
        T = self.args.temperature
        s = self.student(x)
        with torch.no_grad():
            t = self.teacher(x)
        kd = F.kl_div(F.log_softmax(s / T, -1), F.softmax(t / T, -1), reduction="batchmean") * T * T
        ce = F.cross_entropy(s, y)
        return self.args.alpha * kd + (1 - self.args.alpha) * ce

    def train_epoch(self, loader):
        K = self.args.accum
        n = len(loader)
        for i, (x, y) in enumerate(loader):
            boundary = (i + 1) % K == 0 or (i + 1) == n
            window = K if i < n - n % K else n % K
            with self.fabric.no_backward_sync(self.student, enabled=not boundary):
                loss = self.kd_loss(x, y) / window
                self.fabric.backward(loss)
            if boundary:
                self.fabric.clip_gradients(self.student, self.opt, max_norm=self.args.clip)
                self.opt.step()
                self.opt.zero_grad()
        return loss.item() * window


def main():
    args = parse_args()
    fabric = Fabric(accelerator="cpu", devices=2, strategy="ddp")
    fabric.launch()
    fabric.seed_everything(5)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(80, 16, generator=g)
    y = torch.randint(0, 6, (80,), generator=g)
    loader = fabric.setup_dataloaders(DataLoader(TensorDataset(x, y), batch_size=args.batch_size, shuffle=True))
    trainer = Distiller(fabric, args)
    for epoch in range(args.epochs):
        loader.sampler.set_epoch(epoch)
        last = trainer.train_epoch(loader)
        fabric.print(f"epoch {epoch}: loss {last:.4f}")
    if fabric.global_rank == 0:
        flat = torch.cat([p.detach().float().reshape(-1) for _, p in trainer.student.module.named_parameters()])
        print(f"FINAL_SHA256 {hashlib.sha256(flat.numpy().tobytes()).hexdigest()}")


if __name__ == "__main__":
    main()
