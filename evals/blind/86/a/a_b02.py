"""LoRA adaptation of a small MLP classifier with Accelerate's gradient accumulation.

Launch: torchrun --nproc-per-node 2 ... a_b02.py
"""
import argparse
import hashlib

import torch
import torch.nn as nn
import torch.nn.functional as F
from accelerate import Accelerator
from accelerate.utils import set_seed
from peft import LoraConfig, get_peft_model
from torch.utils.data import DataLoader, TensorDataset


def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("--lr", type=float, default=0.5)
    p.add_argument("--micro-bs", type=int, default=8)
    p.add_argument("--accum", type=int, default=4)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--seed", type=int, default=7)
    return p.parse_args()


class Backbone(nn.Module):
    def __init__(self, dim=24, hidden=48, n_cls=5):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, hidden)
        self.cls = nn.Linear(hidden, n_cls)

    def forward(self, x):
        return self.cls(F.gelu(self.fc2(F.gelu(self.fc1(x)))))


def make_data(n=256, dim=24, n_cls=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, dim, generator=g)
    proj = torch.randn(dim, n_cls, generator=g)
    y = (x @ proj + 0.5 * torch.randn(n, n_cls, generator=g)).argmax(-1)
    return TensorDataset(x, y)


class LoraFinetuner:
    def __init__(self, args):
        self.args = args
        self.accelerator = Accelerator(cpu=True, gradient_accumulation_steps=args.accum)
        set_seed(args.seed)
        base = Backbone()
        lora_cfg = LoraConfig(r=4, lora_alpha=8, target_modules=["fc1", "fc2"], modules_to_save=["cls"])
        model = get_peft_model(base, lora_cfg)
        opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=args.lr)
        loader = DataLoader(make_data(), batch_size=args.micro_bs, shuffle=True,
                            generator=torch.Generator().manual_seed(args.seed))
        self.model, self.opt, self.loader = self.accelerator.prepare(model, opt, loader)

    def micro_step(self, batch):
        x, y = batch
        logits = self.model(x)
        loss = F.cross_entropy(logits, y)
        loss.backward()
        return loss.detach()

    def fit(self):
        steps = 0
        for epoch in range(self.args.epochs):
            self.model.train()
            for batch in self.loader:
                with self.accelerator.accumulate(self.model):
                    self.micro_step(batch)
                    self.opt.step()
                    self.opt.zero_grad()
                if self.accelerator.sync_gradients:
                    steps += 1
        return steps

    def fingerprint(self):
        model = self.accelerator.unwrap_model(self.model)
        h = hashlib.sha256()
        for _, p in model.named_parameters():
            h.update(p.detach().to(torch.float32).contiguous().cpu().numpy().tobytes())
        return h.hexdigest()


def main():
    args = parse_args()
    torch.use_deterministic_algorithms(True)
    ft = LoraFinetuner(args)
    steps = ft.fit()
    if ft.accelerator.is_main_process:
        print(f"optimizer steps: {steps}")
        print(f"FINAL_SHA256 {ft.fingerprint()}")


if __name__ == "__main__":
    main()
