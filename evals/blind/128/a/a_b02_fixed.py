"""Sequence classifier on a DeepSpeed ZeRO-2 engine, configured from dataclasses.

The engine owns gradient accumulation: the loop calls engine.backward / engine.step
on every micro-batch and DeepSpeed only applies the optimizer at window boundaries.
"""
import argparse
import hashlib
from dataclasses import asdict, dataclass, field

import deepspeed
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class EngineConfig:
    """Mirrors the DeepSpeed JSON; serialised with asdict()."""
    train_micro_batch_size_per_gpu: int = 4
    gradient_accumulation_steps: int = 4
    gradient_clipping: float = 0.0
    steps_per_print: int = 10_000
    wall_clock_breakdown: bool = False
    zero_optimization: dict = field(default_factory=lambda: {
        "stage": 2,
        "overlap_comm": False,
        "contiguous_gradients": True,
        "reduce_bucket_size": 50_000,
    })


@dataclass
class RunConfig:
    vocab: int = 128
    seq_len: int = 12
    d_model: int = 32
    n_classes: int = 5
    optimizer_steps: int = 10
    lr: float = 2e-3
    seed: int = 7
    engine: EngineConfig = field(default_factory=EngineConfig)


class BagClassifier(nn.Module):
    def __init__(self, cfg: RunConfig):
        super().__init__()
        self.emb = nn.Embedding(cfg.vocab, cfg.d_model)
        self.conv = nn.Conv1d(cfg.d_model, cfg.d_model, 3, padding=1)
        self.norm = nn.LayerNorm(cfg.d_model)
        self.out = nn.Linear(cfg.d_model, cfg.n_classes)

    def forward(self, ids):
        h = self.emb(ids).transpose(1, 2)
        h = F.gelu(self.conv(h)).mean(-1)
        return self.out(self.norm(h))


def synthetic_batches(cfg: RunConfig, rank: int, world: int):
    mb = cfg.engine.train_micro_batch_size_per_gpu
    n_micro = cfg.optimizer_steps * cfg.engine.gradient_accumulation_steps
    g = torch.Generator().manual_seed(cfg.seed * 31 + 5)
    ids = torch.randint(0, cfg.vocab, (n_micro * mb * world, cfg.seq_len), generator=g)
    y = (ids[:, :4].sum(1) + ids[:, -1]) % cfg.n_classes
    ids, y = ids[rank::world], y[rank::world]
    return list(zip(ids.split(mb), y.split(mb)))


class EngineTrainer:
    def __init__(self, cfg: RunConfig):
        self.cfg = cfg
        torch.manual_seed(cfg.seed)
        model = BagClassifier(cfg)
        opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.0)
        self.engine, _, _, _ = deepspeed.initialize(
            model=model, optimizer=opt, config=asdict(cfg.engine))
        self.data = synthetic_batches(cfg, dist.get_rank(), dist.get_world_size())

    def train(self):
        self.engine.train()
        for ids, y in self.data:
            loss = F.cross_entropy(self.engine(ids), y)
            self.engine.backward(loss)
            self.engine.step()
        if dist.get_rank() == 0:
            print(f"optimizer steps taken: {self.engine.global_steps}", flush=True)

    def digest(self):
        h = hashlib.sha256()
        for _, p in self.engine.module.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        return h.hexdigest()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--local_rank", type=int, default=-1)
    parser.parse_args()
    torch.use_deterministic_algorithms(True)
    deepspeed.init_distributed(dist_backend="gloo")
    trainer = EngineTrainer(RunConfig())
    trainer.train()
    sha = trainer.digest()
    if dist.get_rank() == 0:
        print(f"FINAL_SHA256 {sha}", flush=True)


if __name__ == "__main__":
    main()
