"""DDP trainer for a small tabular classifier, warm-started from a saved checkpoint.

Run with torchrun on 2 processes (gloo, CPU).
"""
import hashlib
import os
import tempfile
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP


@dataclass
class TrainConfig:
    seed: int = 17
    d_in: int = 24
    d_hidden: int = 64
    n_classes: int = 6
    micro_batch: int = 8
    grad_accum: int = 4
    optimizer_steps: int = 15
    lr: float = 2e-3
    weight_decay: float = 0.01


class TabularNet(nn.Module):
    def __init__(self, cfg: TrainConfig):
        super().__init__()
        self.inp = nn.Linear(cfg.d_in, cfg.d_hidden)
        self.norm = nn.LayerNorm(cfg.d_hidden)
        self.mid = nn.Linear(cfg.d_hidden, cfg.d_hidden)
        self.out = nn.Linear(cfg.d_hidden, cfg.n_classes)

    def forward(self, x):
        h = F.gelu(self.norm(self.inp(x)))
        h = h + F.gelu(self.mid(h))
        return self.out(h)


class Trainer:
    def __init__(self, cfg: TrainConfig):
        self.cfg = cfg
        self.rank = dist.get_rank()
        self.world = dist.get_world_size()
        torch.manual_seed(cfg.seed)
        self.model = DDP(TabularNet(cfg))
        self.optimizer = None

    # ------------------------------------------------------------------ init
    def pretrained_path(self):
        return os.path.join(tempfile.gettempdir(),
                            f"a_b01_pretrained_{os.environ.get('MASTER_PORT', '0')}.pt")

    def export_pretrained(self):
        """Stand-in for a checkpoint produced by an earlier pre-training job."""
        if self.rank == 0:
            g = torch.Generator().manual_seed(self.cfg.seed + 1000)
            src = TabularNet(self.cfg)
            with torch.no_grad():
                for p in src.parameters():
                    p.copy_(torch.randn(p.shape, generator=g) * 0.2)
            torch.save(src.state_dict(), self.pretrained_path())
        dist.barrier()

    def load_pretrained(self):
        # mmap + assign: no second copy of the weights in host memory
        state = torch.load(self.pretrained_path(), map_location="cpu", mmap=True, weights_only=True)
        self.model.module.load_state_dict(state, assign=True)
        dist.barrier()
        if self.rank == 0:
            os.remove(self.pretrained_path())

    def configure_optimizers(self):
        decay, no_decay = [], []
        for name, p in self.model.named_parameters():
            (no_decay if p.ndim < 2 else decay).append(p)
        self.optimizer = torch.optim.AdamW(
            [{"params": decay, "weight_decay": self.cfg.weight_decay},
             {"params": no_decay, "weight_decay": 0.0}],
            lr=self.cfg.lr)

    # ------------------------------------------------------------------ data
    def make_data(self):
        cfg = self.cfg
        g = torch.Generator().manual_seed(cfg.seed * 100 + self.rank)
        n = cfg.optimizer_steps * cfg.grad_accum * cfg.micro_batch
        w_true = torch.randn(cfg.d_in, cfg.n_classes, generator=torch.Generator().manual_seed(5))
        x = torch.randn(n, cfg.d_in, generator=g) + 0.5 * self.rank
        y = (x @ w_true + 0.3 * torch.randn(n, cfg.n_classes, generator=g)).argmax(-1)
        return list(zip(x.split(cfg.micro_batch), y.split(cfg.micro_batch)))

    # ------------------------------------------------------------------ loop
    def micro_step(self, x, y, sync: bool):
        ctx = self.model.no_sync() if not sync else _null()
        with ctx:
            logits = self.model(x)
            loss = F.cross_entropy(logits, y) / self.cfg.grad_accum
            loss.backward()
        return loss.detach()

    def fit(self):
        self.export_pretrained()
        self.load_pretrained()
        self.configure_optimizers()
        batches = self.make_data()
        K = self.cfg.grad_accum
        for step in range(self.cfg.optimizer_steps):
            window = batches[step * K:(step + 1) * K]
            total = 0.0
            for i, (x, y) in enumerate(window):
                total += self.micro_step(x, y, sync=(i == K - 1)).item()
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
            if self.rank == 0 and step % 5 == 0:
                print(f"step {step} loss {total:.4f}", flush=True)

    def digest(self):
        h = hashlib.sha256()
        for _, p in self.model.module.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        return h.hexdigest()


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


def main():
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    trainer = Trainer(TrainConfig())
    trainer.fit()
    digest = trainer.digest()
    if dist.get_rank() == 0:
        print(f"FINAL_SHA256 {digest}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
