"""Fine-tune a pretrained token classifier on a new label set with DDP.

The pretraining head (10 classes) is swapped for a fresh 5-class head for the
downstream task. Gradient accumulation with DDP's no_sync on the first K-1
micro-batches of every window.
"""
import hashlib
import os
from dataclasses import dataclass
from contextlib import nullcontext

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP


@dataclass
class FinetuneConfig:
    vocab_size: int = 96
    d_model: int = 48
    seq_len: int = 16
    pretrain_classes: int = 10
    task_classes: int = 5
    micro_batch_size: int = 8
    grad_accum_steps: int = 4
    optimizer_steps: int = 12
    lr: float = 2e-3
    weight_decay: float = 0.01
    seed: int = 20251


class Encoder(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.ff1 = nn.Linear(cfg.d_model, 2 * cfg.d_model)
        self.ff2 = nn.Linear(2 * cfg.d_model, cfg.d_model)
        self.norm = nn.LayerNorm(cfg.d_model)

    def forward(self, ids):
        h = self.embed(ids)
        h = self.norm(h + self.ff2(F.gelu(self.ff1(h))))
        return h.mean(dim=1)


class SequenceClassifier(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.encoder = Encoder(cfg)
        self.head = nn.Linear(cfg.d_model, cfg.pretrain_classes)

    def forward(self, ids):
        return self.head(self.encoder(ids))


class FineTuner:
    def __init__(self, cfg, rank, world_size):
        self.cfg = cfg
        self.rank = rank
        self.world_size = world_size
        torch.manual_seed(cfg.seed)
        self.model = SequenceClassifier(cfg)
        self.ddp = None
        self.optimizer = None

    def wrap(self):
        # find_unused_parameters: the old pretraining head no longer takes part
        self.ddp = DDP(self.model, find_unused_parameters=True)

    def reset_head(self, num_classes):
        torch.manual_seed(self.cfg.seed + 1)
        self.model.head = nn.Linear(self.cfg.d_model, num_classes)

    def build_optimizer(self):
        params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(params, lr=self.cfg.lr,
                                           weight_decay=self.cfg.weight_decay)

    def make_data(self):
        cfg = self.cfg
        g = torch.Generator().manual_seed(cfg.seed + 100)
        n_micro = cfg.optimizer_steps * cfg.grad_accum_steps * self.world_size
        ids = torch.randint(0, cfg.vocab_size, (n_micro, cfg.micro_batch_size, cfg.seq_len), generator=g)
        labels = (ids[..., :4].sum(-1) % cfg.task_classes)
        # rank r takes micro-batches r, r + W, r + 2W, ...
        return ids[self.rank::self.world_size], labels[self.rank::self.world_size]

    def train_window(self, ids, labels):
        K = self.cfg.grad_accum_steps
        for i in range(K):
            last = i == K - 1
            with (nullcontext() if last else self.ddp.no_sync()):
                logits = self.ddp(ids[i])
                loss = F.cross_entropy(logits, labels[i]) / K
                loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return loss.item() * K

    def fit(self):
        ids, labels = self.make_data()
        K = self.cfg.grad_accum_steps
        for step in range(self.cfg.optimizer_steps):
            sl = slice(step * K, (step + 1) * K)
            loss = self.train_window(ids[sl], labels[sl])
            if self.rank == 0 and step % 4 == 0:
                print(f"step {step} loss {loss:.4f}")


def params_sha256(model):
    h = hashlib.sha256()
    for _, p in model.named_parameters():
        h.update(p.detach().to(torch.float32).contiguous().numpy().tobytes())
    return h.hexdigest()


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.use_deterministic_algorithms(True)
    cfg = FinetuneConfig()
    trainer = FineTuner(cfg, rank, world)
    trainer.reset_head(cfg.task_classes)
    trainer.wrap()
    trainer.build_optimizer()
    trainer.fit()
    if rank == 0:
        print("FINAL_SHA256", params_sha256(trainer.model))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
