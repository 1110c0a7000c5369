"""Intent classifier fine-tune on a DeepSpeed ZeRO-1 engine (bf16), client AdamW + warm-up.

Launched with the deepspeed launcher on 2 ranks. The engine owns gradient
accumulation (gradient_accumulation_steps in the config) and the client
LambdaLR is handed to the engine so it advances once per optimizer step.
"""
import argparse
import hashlib
import math
import os
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
import deepspeed
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


@dataclass
class TrainConfig:
    vocab: int = 96
    dim: int = 48
    n_classes: int = 7
    seq_len: int = 12
    micro_batch: int = 4
    grad_accum: int = 4
    optimizer_steps: int = 8
    lr: float = 3e-3
    warmup_steps: int = 3
    weight_decay: float = 0.01
    seed: int = 1234


class BagEncoder(nn.Module):
    def __init__(self, cfg: TrainConfig):
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab, cfg.dim)
        self.mix = nn.Sequential(nn.Linear(cfg.dim, cfg.dim * 2), nn.GELU(), nn.Linear(cfg.dim * 2, cfg.dim))
        self.norm = nn.LayerNorm(cfg.dim)
        self.cls = nn.Linear(cfg.dim, cfg.n_classes)

    def forward(self, ids):
        h = self.embed(ids)
        h = h + self.mix(h)
        h = self.norm(h).mean(dim=1)
        return self.cls(h)


def synthetic_intents(cfg: TrainConfig, world: int):
    g = torch.Generator().manual_seed(cfg.seed + 1)
    n = cfg.micro_batch * cfg.grad_accum * cfg.optimizer_steps * world
    ids = torch.randint(0, cfg.vocab, (n, cfg.seq_len), generator=g)
    labels = (ids[:, :3].sum(dim=1) % cfg.n_classes).long()
    return TensorDataset(ids, labels)


class IntentTrainer:
    def __init__(self, cfg: TrainConfig, local_rank: int):
        self.cfg = cfg
        torch.manual_seed(cfg.seed)
        model = BagEncoder(cfg)
        decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
        no_decay = [p for n, p in model.named_parameters() if p.ndim < 2]
        optimizer = torch.optim.AdamW(
            [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
            lr=cfg.lr,
        )
        warm = cfg.warmup_steps
        total = cfg.optimizer_steps
        scheduler = torch.optim.lr_scheduler.LambdaLR(
            optimizer,
            lambda s: (s + 1) / warm if s < warm else 0.5 * (1 + math.cos(math.pi * (s - warm) / max(1, total - warm))),
        )
        ds_config = {
            "train_micro_batch_size_per_gpu": cfg.micro_batch,
            "gradient_accumulation_steps": cfg.grad_accum,
            "gradient_clipping": 0.0,
            "bf16": {"enabled": True},
            "zero_optimization": {"stage": 1},
            "steps_per_print": 10**9,
            "wall_clock_breakdown": False,
        }
        self.engine, _, _, self.scheduler = deepspeed.initialize(
            model=model, optimizer=optimizer, lr_scheduler=scheduler, config=ds_config
        )
        world = torch.distributed.get_world_size()
        data = synthetic_intents(cfg, world)
        self.sampler = DistributedSampler(data, num_replicas=world, rank=torch.distributed.get_rank(), shuffle=True, seed=cfg.seed)
        self.loader = DataLoader(data, batch_size=cfg.micro_batch, sampler=self.sampler, drop_last=True)

    def compute_loss(self, batch):
        ids, labels = (t.to(self.engine.device) for t in batch)
        logits = self.engine(ids)
        return F.cross_entropy(logits.float(), labels)

    def train_epoch(self, epoch: int):
        self.sampler.set_epoch(epoch)
        self.engine.train()
        for i, batch in enumerate(self.loader):
            loss = self.compute_loss(batch)
            self.engine.backward(loss)
            self.engine.step()

    def fingerprint(self) -> str:
        h = hashlib.sha256()
        for _, p in self.engine.module.named_parameters():
            h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
        return h.hexdigest()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--local_rank", type=int, default=int(os.environ.get("LOCAL_RANK", 0)))
    args = parser.parse_args()
    deepspeed.init_distributed(dist_backend="gloo")
    torch.use_deterministic_algorithms(True)
    trainer = IntentTrainer(TrainConfig(), args.local_rank)
    trainer.train_epoch(0)
    if torch.distributed.get_rank() == 0:
        print(f"FINAL_SHA256 {trainer.fingerprint()}", flush=True)
    torch.distributed.barrier()


if __name__ == "__main__":
    main()
