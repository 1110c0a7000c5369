"""Accelerate + PEFT LoRA fine-tune of a small tabular MLP classifier, wrapped in a runner class."""
import argparse
import hashlib

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset
from accelerate import Accelerator
from accelerate.utils import set_seed
from peft import LoraConfig, get_peft_model


def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("--micro-batch-size", type=int, default=8)
    p.add_argument("--gradient-accumulation-steps", type=int, default=4)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--lr", type=float, default=5e-3)
    p.add_argument("--lora-r", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args()


class Backbone(nn.Module):
    def __init__(self, d_in=20, d_h=64, n_cls=5):
        super().__init__()
        self.fc1 = nn.Linear(d_in, d_h)
        self.fc2 = nn.Linear(d_h, d_h)
        self.head = nn.Linear(d_h, n_cls)

    def forward(self, x):
        return self.head(F.silu(self.fc2(F.silu(self.fc1(x)))))


def synthetic_dataset(n=512, d_in=20, n_cls=5):
    g = torch.Generator().manual_seed(11)
    x = torch.randn(n, d_in, generator=g)
    proj = torch.randn(d_in, n_cls, generator=g)
    y = (torch.tanh(x) @ proj).argmax(-1)
    return TensorDataset(x, y)


class LoRARunner:
    def __init__(self, args):
        self.args = args
        self.accelerator = Accelerator(cpu=True, gradient_accumulation_steps=args.gradient_accumulation_steps)
        set_seed(args.seed)
        base = Backbone()
        cfg = LoraConfig(r=args.lora_r, lora_alpha=8, lora_dropout=0.0,
                         target_modules=["fc1", "fc2"], modules_to_save=["head"])
        self.model = get_peft_model(base, cfg)
        self.optimizer = torch.optim.AdamW(
            [p for p in self.model.parameters() if p.requires_grad], lr=args.lr, weight_decay=0.0)
        self.loader = DataLoader(synthetic_dataset(), batch_size=args.micro_batch_size, shuffle=False)

    def setup(self):
        model, optimizer, loader = self.accelerator.prepare(self.model, self.optimizer, self.loader)
        self.model, self.optimizer, self.loader = model, optimizer, loader

    def train_step(self, batch):
        x, y = batch
        with self.accelerator.accumulate(self.model):
            loss = F.cross_entropy(self.model(x), y)
            self.accelerator.backward(loss)
            self.optimizer.step()
            self.optimizer.zero_grad()
        return loss.detach()

    def fit(self):
        self.setup()
        self.model.train()
        for _ in range(self.args.epochs):
            for batch in self.loader:
                self.train_step(batch)

    def digest(self):
        net = self.accelerator.unwrap_model(self.model)
        h = hashlib.sha256()
        for _, p in net.named_parameters():
            h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
        return h.hexdigest()


def main():
    runner = LoRARunner(parse_args())
    runner.fit()
    digest = runner.digest()
    if runner.accelerator.is_main_process:
        print(f"FINAL_SHA256 {digest}")


if __name__ == "__main__":
    main()
