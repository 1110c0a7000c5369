"""DeepSpeed ZeRO-2 trainer class for a small intent classifier.

All run settings live in one dataclass; the DeepSpeed config (including the
warm-up + cosine schedule) is derived from it before the engine is built, and the
engine hands back its own sharded training DataLoader.
"""
import argparse
import hashlib
import math
from dataclasses import dataclass

import deepspeed
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import TensorDataset


@dataclass
class RunConfig:
    n_samples: int = 192
    d_in: int = 32
    hidden: int = 64
    n_classes: int = 6
    micro_batch_size: int = 4
    grad_accum_steps: int = 2
    epochs: int = 2
    lr: float = 4e-3
    warmup_steps: int = 3
    clip: float = 1.0
    seed: int = 11


class IntentMLP(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.inp = nn.Linear(cfg.d_in, cfg.hidden)
        self.norm = nn.LayerNorm(cfg.hidden)
        self.mid = nn.Linear(cfg.hidden, cfg.hidden)
        self.out = nn.Linear(cfg.hidden, cfg.n_classes)

    def forward(self, x):
        h = F.gelu(self.norm(self.inp(x)))
        h = h + F.gelu(self.mid(h))
        return self.out(h)


def make_dataset(cfg):
    g = torch.Generator().manual_seed(cfg.seed)
    x = torch.randn(cfg.n_samples, cfg.d_in, generator=g)
    w = torch.randn(cfg.d_in, cfg.n_classes, generator=g)
    y = (x @ w + 0.5 * torch.randn(cfg.n_samples, cfg.n_classes, generator=g)).argmax(-1)
    return TensorDataset(x, y)


class ZeroTrainer:
    def __init__(self, cfg: RunConfig):
        self.cfg = cfg
        torch.manual_seed(cfg.seed)
        self.dataset = make_dataset(cfg)
        model = IntentMLP(cfg)
        optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.0)
        self.engine, _, self.loader, self.scheduler = deepspeed.initialize(
            model=model,
            optimizer=optimizer,
            config=self.ds_config(),
            training_data=self.dataset,
        )

    def total_optimizer_steps(self):
        cfg = self.cfg
        steps_per_epoch = math.ceil(len(self.dataset) / (cfg.micro_batch_size * cfg.grad_accum_steps))
        return steps_per_epoch * cfg.epochs

    def ds_config(self):
        cfg = self.cfg
        world = dist.get_world_size()
        return {
            "train_micro_batch_size_per_gpu": cfg.micro_batch_size,
            "gradient_accumulation_steps": cfg.grad_accum_steps,
            "train_batch_size": cfg.micro_batch_size * cfg.grad_accum_steps * world,
            "gradient_clipping": cfg.clip,
            "zero_optimization": {"stage": 2},
            "zero_allow_untested_optimizer": True,
            "zero_force_ds_cpu_optimizer": False,
            "scheduler": {
                "type": "WarmupCosineLR",
                "params": {
                    "total_num_steps": self.total_optimizer_steps(),
                    "warmup_num_steps": cfg.warmup_steps,
                    "warmup_type": "linear",
                    "warmup_min_ratio": 0.1,
                    "cos_min_ratio": 0.01,
                },
            },
            "steps_per_print": 10_000,
        }

    def train(self):
        self.engine.train()
        for epoch in range(self.cfg.epochs):
            if hasattr(self.loader, "data_sampler"):
                self.loader.data_sampler.set_epoch(epoch)
            for x, y in self.loader:
                loss = F.cross_entropy(self.engine(x), y)
                self.engine.backward(loss)
                self.engine.step()

    def digest(self):
        h = hashlib.sha256()
        flat = []
        for _, p in self.engine.module.named_parameters():
            t = p.detach().to(torch.float32).contiguous()
            h.update(t.numpy().tobytes())
            flat.append(t.reshape(-1))
        return h.hexdigest(), torch.cat(flat)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--local_rank", type=int, default=-1)
    ap.add_argument("--dump", default=None)
    args, _ = ap.parse_known_args()
    deepspeed.init_distributed(dist_backend="gloo")
    trainer = ZeroTrainer(RunConfig())
    trainer.train()
    digest, flat = trainer.digest()
    if dist.get_rank() == 0:
        if args.dump:
            torch.save(flat, args.dump)
        print(f"FINAL_SHA256 {digest}")


if __name__ == "__main__":
    main()
