"""DDP classifier trainer with gradient accumulation (config dataclass + trainer class)."""
import hashlib
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


@dataclass
class TrainConfig:
    seed: int = 1234
    n_samples: int = 384
    in_dim: int = 24
    hidden: int = 64
    n_classes: int = 5
    micro_batch: int = 8
    grad_accum: int = 4
    epochs: int = 2
    lr: float = 0.05
    momentum: float = 0.9
    weight_decay: float = 1e-4


def make_dataset(cfg):
    g = torch.Generator().manual_seed(cfg.seed)
    x = torch.randn(cfg.n_samples, cfg.in_dim, generator=g)
    w = torch.randn(cfg.in_dim, cfg.n_classes, generator=g)
    y = (x @ w + 0.3 * torch.randn(cfg.n_samples, cfg.n_classes, generator=g)).argmax(-1)
    return TensorDataset(x, y)


class Classifier(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.body = nn.Sequential(
            nn.Linear(cfg.in_dim, cfg.hidden), nn.GELU(),
            nn.Linear(cfg.hidden, cfg.hidden), nn.GELU(),
        )
        self.head = nn.Linear(cfg.hidden, cfg.n_classes)

    def forward(self, x):
        return self.head(self.body(x))


class DDPTrainer:
    def __init__(self, cfg: TrainConfig):
        self.cfg = cfg
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        torch.manual_seed(cfg.seed)
        self.model = DDP(Classifier(cfg))
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=cfg.lr,
                                         momentum=cfg.momentum, weight_decay=cfg.weight_decay)
        ds = make_dataset(cfg)
        self.sampler = DistributedSampler(ds, num_replicas=self.world_size, rank=self.rank,
                                          shuffle=True, seed=cfg.seed, drop_last=True)
        self.loader = DataLoader(ds, batch_size=cfg.micro_batch, sampler=self.sampler)
        self.updates = 0

    def _micro_step(self, batch, sync):
        x, y = batch
        ctx = self.model.no_sync() if not sync else _null()
        with ctx:
            loss = F.cross_entropy(self.model(x), y) / self.cfg.grad_accum
            loss.backward()
        return loss.detach()

    def _reduce_gradients(self):
        # DDP's all-reduce already averaged the gradients over the ranks
        pass

    def _optimizer_step(self):
        self._reduce_gradients()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.updates += 1

    def train(self):
        K = self.cfg.grad_accum
        for epoch in range(self.cfg.epochs):
            self.sampler.set_epoch(epoch)
            for i, batch in enumerate(self.loader):
                boundary = (i + 1) % K == 0
                self._micro_step(batch, sync=boundary)
                if boundary:
                    self._optimizer_step()

    def final_digest(self):
        flat = torch.cat([p.detach().float().reshape(-1) for _, p in self.model.module.named_parameters()])
        dump = os.environ.get("DUMP_DIR")
        if dump and self.rank == 0:
            torch.save(flat, os.path.join(dump, os.path.basename(__file__) + ".pt"))
        return hashlib.sha256(flat.numpy().tobytes()).hexdigest()


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


def main():
    dist.init_process_group("gloo")
    torch.use_deterministic_algorithms(True)
    trainer = DDPTrainer(TrainConfig())
    trainer.train()
    digest = trainer.final_digest()
    if trainer.rank == 0:
        print(f"updates={trainer.updates}")
        print(f"FINAL_SHA256 {digest}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
