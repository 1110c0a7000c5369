"""Pairwise reward model (TRL RewardTrainer-style loss) trained with Lightning Fabric.

Launch: torchrun --nproc-per-node 2 ... c_b01.py
"""
import hashlib
import os
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
from lightning_fabric import Fabric
from torch.utils.data import DataLoader, Dataset


@dataclass
class RMConfig:
    vocab_size: int = 96
    hidden: int = 48
    seq_len: int = 20
    n_pairs: int = 80
    micro_batch: int = 4
    grad_accum: int = 4
    epochs: int = 3
    lr: float = 3e-3
    weight_decay: float = 0.01
    margin_weight: float = 0.1
    seed: int = 1234


class PairDataset(Dataset):
    """Synthetic preference pairs: chosen sequences carry more 'good' tokens."""

    def __init__(self, cfg: RMConfig):
        g = torch.Generator().manual_seed(cfg.seed)
        n, t, v = cfg.n_pairs, cfg.seq_len, cfg.vocab_size
        self.chosen = torch.randint(0, v, (n, t), generator=g)
        self.rejected = torch.randint(0, v, (n, t), generator=g)
        good = torch.randint(0, v // 4, (n, t), generator=g)
        keep = torch.rand(n, t, generator=g) < 0.4
        self.chosen = torch.where(keep, good, self.chosen)
        self.margin = torch.rand(n, generator=g)

    def __len__(self):
        return self.chosen.shape[0]

    def __getitem__(self, i):
        return {"chosen": self.chosen[i], "rejected": self.rejected[i], "margin": self.margin[i]}


class RewardModel(nn.Module):
    def __init__(self, cfg: RMConfig):
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden)
        self.encoder = nn.Sequential(
            nn.Linear(cfg.hidden, cfg.hidden), nn.GELU(), nn.Linear(cfg.hidden, cfg.hidden)
        )
        self.norm = nn.LayerNorm(cfg.hidden)
        self.score = nn.Linear(cfg.hidden, 1)

    def forward(self, ids):
        h = self.encoder(self.embed(ids))
        return self.score(self.norm(h.mean(dim=1))).squeeze(-1)


def pairwise_loss(model, batch, margin_weight):
    ids = torch.cat([batch["chosen"], batch["rejected"]], dim=0)
    rewards = model(ids)
    r_c, r_r = rewards.chunk(2)
    return -F.logsigmoid(r_c - r_r - margin_weight * batch["margin"]).mean()


def params_sha(module):
    h = hashlib.sha256()
    flat = []
    for _, p in module.named_parameters():
        t = p.detach().float().cpu().contiguous()
        h.update(t.numpy().tobytes())
        flat.append(t.reshape(-1))
    return h.hexdigest(), torch.cat(flat)


def main():
    cfg = RMConfig()
    torch.use_deterministic_algorithms(True)
    fabric = Fabric(accelerator="cpu", devices=2, strategy="ddp", precision="32-true")
    fabric.launch()
    fabric.seed_everything(cfg.seed)

    model = RewardModel(cfg)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    model, optimizer = fabric.setup(model, optimizer)
    loader = DataLoader(PairDataset(cfg), batch_size=cfg.micro_batch, shuffle=True,
                        generator=torch.Generator().manual_seed(cfg.seed))
    loader = fabric.setup_dataloaders(loader)

    K = cfg.grad_accum
    steps = 0
    for epoch in range(cfg.epochs):
        loader.sampler.set_epoch(epoch)
        model.train()
        n_batches = len(loader)
        for batch_idx, batch in enumerate(loader):
            window = min(K, n_batches - (batch_idx // K) * K)
            is_accumulating = (batch_idx + 1) % K != 0 and batch_idx + 1 != n_batches
            with fabric.no_backward_sync(model, enabled=is_accumulating):
                loss = pairwise_loss(model, batch, cfg.margin_weight)
                fabric.backward(loss / window)
            if not is_accumulating:
                optimizer.step()
                optimizer.zero_grad()
                steps += 1
        fabric.print(f"epoch {epoch} done, optimizer steps so far {steps}")

    digest, flat = params_sha(model.module if hasattr(model, "module") else model)
    if fabric.global_rank == 0:
        if os.environ.get("PARAM_DUMP"):
            torch.save(flat, os.environ["PARAM_DUMP"])
        print(f"FINAL_SHA256 {digest}", flush=True)


if __name__ == "__main__":
    main()
