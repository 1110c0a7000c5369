"""Image-patch classifier: a conv encoder and an MLP head prepared as two models with
Accelerate, accumulating 2 batches per update, with a periodic held-out evaluation."""
import gc
import hashlib
import os
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset
from accelerate import Accelerator
from accelerate.utils import set_seed


@dataclass
class Cfg:
    n_train: int = 160
    n_eval: int = 32
    batch_size: int = 4
    grad_accum: int = 2
    epochs: int = 2
    eval_every: int = 5          # batches
    lr: float = 2e-3
    seed: int = 11


def synthetic_images(n, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 3, 12, 12, generator=g)
    y = (x[:, 0, :6].mean((1, 2)) > x[:, 1, 6:].mean((1, 2))).long() + 2 * (x[:, 2].std((1, 2)) > 1.0).long()
    return TensorDataset(x, y)


class Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, 3, stride=2, padding=1)
        self.norm = nn.LayerNorm(32)

    def forward(self, x):
        h = F.gelu(self.conv2(F.gelu(self.conv1(x))))
        return self.norm(h.mean((2, 3)))


class Head(nn.Module):
    def __init__(self, n_classes=4):
        super().__init__()
        self.fc1 = nn.Linear(32, 64)
        self.fc2 = nn.Linear(64, n_classes)

    def forward(self, z):
        return self.fc2(F.gelu(self.fc1(z)))


class Runner:
    def __init__(self, cfg: Cfg):
        self.cfg = cfg
        self.accelerator = Accelerator(gradient_accumulation_steps=cfg.grad_accum, cpu=True)
        set_seed(cfg.seed)
        encoder, head = Encoder(), Head()
        opt = torch.optim.AdamW(list(encoder.parameters()) + list(head.parameters()), lr=cfg.lr, weight_decay=0.01)
        train_dl = DataLoader(synthetic_images(cfg.n_train, cfg.seed), batch_size=cfg.batch_size, shuffle=False)
        eval_dl = DataLoader(synthetic_images(cfg.n_eval, cfg.seed + 1), batch_size=8)
        (self.encoder, self.head, self.opt, self.train_dl, self.eval_dl) = self.accelerator.prepare(
            encoder, head, opt, train_dl, eval_dl)

    @torch.no_grad()
    def evaluate(self):
        self.encoder.eval(); self.head.eval()
        correct = total = 0
        for x, y in self.eval_dl:
            pred = self.head(self.encoder(x)).argmax(-1)
            pred, y = self.accelerator.gather_for_metrics((pred, y))
            correct += (pred == y).sum().item(); total += y.numel()
        self.encoder.train(); self.head.train()
        # drop activations/cached tensors of the eval pass before going back to training
        gc.collect()
        return correct / max(total, 1)

    def train_epoch(self, epoch):
        for step, (x, y) in enumerate(self.train_dl):
            with self.accelerator.accumulate(self.encoder, self.head):
                loss = F.cross_entropy(self.head(self.encoder(x)), y)
                self.accelerator.backward(loss)
                self.opt.step()
                self.opt.zero_grad()
            if (step + 1) % self.cfg.eval_every == 0:
                acc = self.evaluate()
                self.accelerator.print(f"epoch {epoch} batch {step + 1} eval_acc {acc:.3f}")

    def fit(self):
        for epoch in range(self.cfg.epochs):
            self.train_epoch(epoch)
        self.accelerator.wait_for_everyone()

    def final_sha256(self):
        h = hashlib.sha256()
        flat = []
        for m in (self.encoder, self.head):
            for _, p in self.accelerator.unwrap_model(m).named_parameters():
                t = p.detach().float().cpu().contiguous()
                h.update(t.numpy().tobytes())
                flat.append(t.reshape(-1))
        if os.environ.get("A_DUMP"):
            torch.save(torch.cat(flat), os.environ["A_DUMP"])
        return h.hexdigest()


def main():
    runner = Runner(Cfg())
    runner.fit()
    digest = runner.final_sha256()
    if runner.accelerator.is_main_process:
        print(f"FINAL_SHA256 {digest}", flush=True)
    runner.accelerator.end_training()


if __name__ == "__main__":
    main()
