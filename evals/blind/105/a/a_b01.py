"""Pairwise reward-model fine-tuning with Accelerate + PEFT LoRA.

A small scorer network gets LoRA adapters on its two hidden projections; the
scalar head is trained in full through ``modules_to_save``.  Bradley-Terry loss
over (chosen, rejected) pairs, gradient accumulation handled by Accelerate.
"""
import hashlib
import os
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
from accelerate import Accelerator
from accelerate.utils import set_seed
from peft import LoraConfig, get_peft_model
from torch.utils.data import DataLoader, TensorDataset


@dataclass
class RMConfig:
    feat_dim: int = 24
    hidden: int = 48
    lora_r: int = 8
    lora_alpha: int = 16
    lr: float = 2e-3
    weight_decay: float = 0.01
    micro_batch: int = 6
    grad_accum: int = 4
    epochs: int = 2
    n_pairs: int = 288          # 288 / (2 ranks * 6) = 24 micro-batches per rank
    max_grad_norm: float = 1.0
    seed: int = 1234


class PairScorer(nn.Module):
    def __init__(self, cfg: RMConfig):
        super().__init__()
        self.fc1 = nn.Linear(cfg.feat_dim, cfg.hidden)
        self.fc2 = nn.Linear(cfg.hidden, cfg.hidden)
        self.head = nn.Linear(cfg.hidden, 1)

    def score(self, x):
        h = F.gelu(self.fc1(x))
        h = F.gelu(self.fc2(h)) + h
        return self.head(h).squeeze(-1)

    def pairwise_loss(self, chosen, rejected, margin=None):
        diff = self.score(chosen) - self.score(rejected)
        if margin is not None:
            diff = diff - margin
        return -F.logsigmoid(diff).mean()

    def forward(self, chosen, rejected, margin=None):
        return self.pairwise_loss(chosen, rejected, margin)


def make_pairs(cfg: RMConfig):
    g = torch.Generator().manual_seed(7)
    w = torch.randn(cfg.feat_dim, generator=g)
    a = torch.randn(cfg.n_pairs, cfg.feat_dim, generator=g)
    b = torch.randn(cfg.n_pairs, cfg.feat_dim, generator=g)
    better_a = (a @ w > b @ w).unsqueeze(-1)
    chosen = torch.where(better_a, a, b)
    rejected = torch.where(better_a, b, a)
    margin = 0.1 * torch.rand(cfg.n_pairs, generator=g)
    return TensorDataset(chosen, rejected, margin)


class RewardRunner:
    def __init__(self, cfg: RMConfig):
        self.cfg = cfg
        self.accelerator = Accelerator(gradient_accumulation_steps=cfg.grad_accum, cpu=True)
        set_seed(cfg.seed)
        base = PairScorer(cfg)
        lcfg = LoraConfig(r=cfg.lora_r, lora_alpha=cfg.lora_alpha, lora_dropout=0.0,
                          target_modules=["fc1", "fc2"], modules_to_save=["head"])
        model = get_peft_model(base, lcfg)
        opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad],
                                lr=cfg.lr, weight_decay=cfg.weight_decay)
        loader = DataLoader(make_pairs(cfg), batch_size=cfg.micro_batch, shuffle=True,
                            generator=torch.Generator().manual_seed(cfg.seed))
        updates = cfg.epochs * (len(loader) // self.accelerator.num_processes) // cfg.grad_accum
        sched = torch.optim.lr_scheduler.LambdaLR(
            opt, lambda s: max(0.0, 1.0 - s / (updates * self.accelerator.num_processes)))
        self.model, self.opt, self.loader, self.sched = self.accelerator.prepare(model, opt, loader, sched)

    def compute_loss(self, batch):
        chosen, rejected, margin = batch
        scorer = self.accelerator.unwrap_model(self.model)
        return scorer.pairwise_loss(chosen, rejected, margin)

    def train(self):
        acc = self.accelerator
        self.model.train()
        for epoch in range(self.cfg.epochs):
            for batch in self.loader:
                with acc.accumulate(self.model):
                    loss = self.compute_loss(batch)
                    acc.backward(loss)
                    if acc.sync_gradients:
                        acc.clip_grad_norm_(self.model.parameters(), self.cfg.max_grad_norm)
                    self.opt.step()
                    self.sched.step()
                    self.opt.zero_grad()
            acc.print(f"epoch {epoch} loss {loss.item():.4f}")

    def final_digest(self):
        model = self.accelerator.unwrap_model(self.model)
        h = hashlib.sha256()
        for _, p in model.named_parameters():
            h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
        if os.environ.get("DUMP_PARAMS") and self.accelerator.is_main_process:
            torch.save({n: p.detach().float().clone() for n, p in model.named_parameters()},
                       os.environ["DUMP_PARAMS"])
        return h.hexdigest()


def main():
    torch.use_deterministic_algorithms(True)
    runner = RewardRunner(RMConfig())
    runner.train()
    digest = runner.final_digest()
    if runner.accelerator.is_main_process:
        print(f"FINAL_SHA256 {digest}")
    runner.accelerator.end_training()


if __name__ == "__main__":
    main()
