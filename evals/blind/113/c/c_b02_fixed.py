"""
Image classifier trained with Accelerate, gradient accumulation done by hand.

We keep the Accelerator for process setup / data sharding / DDP wrapping but do the
accumulation ourselves: `accelerator.no_sync(model)` on the non-boundary micro-steps,
each micro-batch loss divided by the size of its window (so the short window at the end
of an epoch is not down-weighted), one optimizer step per window.
"""
import argparse
import contextlib
import hashlib
import os

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset
from accelerate import Accelerator
from accelerate.utils import set_seed


def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("--per_device_batch_size", type=int, default=4)
    p.add_argument("--gradient_accumulation_steps", type=int, default=4)
    p.add_argument("--num_epochs", type=int, default=4)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--max_grad_norm", type=float, default=5.0)
    p.add_argument("--n_train", type=int, default=80)
    p.add_argument("--seed", type=int, default=17)
    return p.parse_args()


class SmallConvNet(nn.Module):
    def __init__(self, n_classes=5):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1), nn.GroupNorm(2, 8), nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(8, 16, 3, padding=1), nn.GroupNorm(4, 16), nn.ReLU(),
            nn.AdaptiveAvgPool2d(2),
        )
        self.head = nn.Linear(16 * 4, n_classes)

    def forward(self, x):
        return self.head(self.features(x).flatten(1))


def synthetic_images(n, seed, n_classes=5):
    g = torch.Generator().manual_seed(seed)
    protos = torch.randn(n_classes, 3, 12, 12, generator=g)
    y = torch.randint(0, n_classes, (n,), generator=g)
    x = protos[y] + 0.8 * torch.randn(n, 3, 12, 12, generator=g)
    return TensorDataset(x, y)


class Trainer:
    def __init__(self, args):
        self.args = args
        self.accelerator = Accelerator(cpu=True)  # CPU cluster: gloo
        set_seed(args.seed)
        model = SmallConvNet()
        optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
        self.train_ds = synthetic_images(args.n_train, args.seed)
        train_dl = DataLoader(self.train_ds, batch_size=args.per_device_batch_size, shuffle=True,
                              generator=torch.Generator().manual_seed(args.seed))
        self.model, self.optimizer, self.train_dl = self.accelerator.prepare(model, optimizer, train_dl)
        # halve the LR after 8 optimizer updates
        self.scheduler = torch.optim.lr_scheduler.MultiStepLR(self.optimizer.optimizer, milestones=[8], gamma=0.5)
        self.updates = 0

    def window_size(self, step, steps_per_epoch):
        K = self.args.gradient_accumulation_steps
        start = (step // K) * K
        return min(K, steps_per_epoch - start)

    def train_epoch(self, epoch):
        K = self.args.gradient_accumulation_steps
        steps_per_epoch = len(self.train_dl)
        self.model.train()
        for step, (x, y) in enumerate(self.train_dl):
            boundary = (step + 1) % K == 0 or step + 1 == steps_per_epoch
            ctx = contextlib.nullcontext() if boundary else self.accelerator.no_sync(self.model)
            with ctx:
                logits = self.model(x)
                loss = F.cross_entropy(logits, y)
                self.accelerator.backward(loss / self.window_size(step, steps_per_epoch))
            if boundary:
                self.accelerator.clip_grad_norm_(self.model.parameters(), self.args.max_grad_norm)
                self.optimizer.step()
                self.scheduler.step()
                self.optimizer.zero_grad()
                self.updates += 1
        self.accelerator.print(f"epoch {epoch}: updates so far {self.updates}, last loss {loss.item():.4f}")

    def fit(self):
        for epoch in range(self.args.num_epochs):
            self.train_epoch(epoch)

    def final_hash(self):
        model = self.accelerator.unwrap_model(self.model)
        if self.accelerator.is_main_process:
            h = hashlib.sha256()
            for _, p in model.named_parameters():
                h.update(p.detach().float().contiguous().numpy().tobytes())
            print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
            if os.environ.get("PARAM_DUMP"):
                torch.save({n: p.detach().clone() for n, p in model.named_parameters()}, os.environ["PARAM_DUMP"])
        self.accelerator.wait_for_everyone()


def main():
    args = parse_args()
    trainer = Trainer(args)
    trainer.fit()
    trainer.final_hash()
    trainer.accelerator.end_training()


if __name__ == "__main__":
    main()
