"""DeepSpeed ZeRO-2 regression trainer with a plateau-driven learning rate."""
import hashlib
from dataclasses import dataclass, field

import deepspeed
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.optim.lr_scheduler import ReduceLROnPlateau
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


@dataclass
class TrainConfig:
    in_dim: int = 24
    hidden: int = 64
    micro_batch: int = 8
    grad_accum: int = 4
    max_steps: int = 24
    lr: float = 2e-3
    plateau_factor: float = 0.5
    plateau_patience: int = 2
    seed: int = 7
    zero_stage: int = 2
    ds_extra: dict = field(default_factory=lambda: {"gradient_clipping": 0.0})

    def deepspeed_config(self, world):
        cfg = {
            "train_micro_batch_size_per_gpu": self.micro_batch,
            "gradient_accumulation_steps": self.grad_accum,
            "train_batch_size": self.micro_batch * self.grad_accum * world,
            "zero_optimization": {"stage": self.zero_stage},
            "steps_per_print": 10_000,
            "wall_clock_breakdown": False,
        }
        cfg.update(self.ds_extra)
        return cfg


class Regressor(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(cfg.in_dim, cfg.hidden), nn.SiLU(),
            nn.Linear(cfg.hidden, cfg.hidden), nn.SiLU(),
            nn.Linear(cfg.hidden, 1),
        )

    def forward(self, x):
        return self.net(x).squeeze(-1)


class ZeroTrainer:
    def __init__(self, cfg: TrainConfig):
        self.cfg = cfg
        self.world = dist.get_world_size()
        self.rank = dist.get_rank()
        model = Regressor(cfg)
        base_opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.0)
        self.engine, _, _, _ = deepspeed.initialize(
            model=model, optimizer=base_opt, config=cfg.deepspeed_config(self.world)
        )
        # the plateau scheduler drives the wrapped torch optimizer's groups
        self.plateau = ReduceLROnPlateau(
            base_opt, mode="min", factor=cfg.plateau_factor, patience=cfg.plateau_patience, threshold=1e-3
        )
        self.loader = self._build_loader()

    def _build_loader(self):
        g = torch.Generator().manual_seed(self.cfg.seed)
        n = self.cfg.micro_batch * self.cfg.grad_accum * self.world * self.cfg.max_steps
        x = torch.randn(n, self.cfg.in_dim, generator=g)
        w = torch.randn(self.cfg.in_dim, generator=g)
        y = torch.tanh(x @ w) + 0.3 * torch.randn(n, generator=g)
        ds = TensorDataset(x, y)
        sampler = DistributedSampler(ds, num_replicas=self.world, rank=self.rank, shuffle=False)
        return DataLoader(ds, batch_size=self.cfg.micro_batch, sampler=sampler)

    def _global_mean(self, value):
        t = torch.tensor([value], dtype=torch.float64)
        dist.all_reduce(t)
        return t.item() / self.world

    def train(self):
        self.engine.train()
        window_loss = 0.0
        for x, y in self.loader:
            loss = F.mse_loss(self.engine(x), y)
            self.engine.backward(loss)
            self.engine.step()
            window_loss += loss.item() / self.cfg.grad_accum
            if self.engine.was_step_applied():
                self.plateau.step(self._global_mean(window_loss))
                window_loss = 0.0
            if self.engine.global_steps >= self.cfg.max_steps:
                break

    def final_params(self):
        return [(n, p.detach().float().contiguous()) for n, p in self.engine.module.named_parameters()]


def main():
    cfg = TrainConfig()
    deepspeed.init_distributed(dist_backend="gloo")
    torch.manual_seed(cfg.seed)
    trainer = ZeroTrainer(cfg)
    trainer.train()
    final = trainer.final_params()
    h = hashlib.sha256()
    for _, t in final:
        h.update(t.numpy().tobytes())
    rank = dist.get_rank()
    if rank == 0:
        print(f"FINAL_SHA256 {h.hexdigest()}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
