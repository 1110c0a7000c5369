"""ZeRO-2 regression trainer with periodic checkpoints and preemption recovery.

The job is preempted once (simulated after `preempt_after` batches); a fresh
engine is built, the last checkpoint is loaded and training continues from the
batch recorded in it.
"""
import hashlib
import shutil
import tempfile
from dataclasses import dataclass, asdict

import deepspeed
import torch
import torch.distributed as dist
import torch.nn as nn


@dataclass
class TrainConfig:
    in_dim: int = 16
    hidden: int = 64
    micro_batch: int = 4
    grad_accum: int = 4
    total_batches: int = 24
    save_every: int = 8
    preempt_after: int = 10
    lr: float = 2e-3
    seed: int = 7


def ds_config(cfg: TrainConfig, world: int) -> dict:
    return {
        "train_micro_batch_size_per_gpu": cfg.micro_batch,
        "gradient_accumulation_steps": cfg.grad_accum,
        "train_batch_size": cfg.micro_batch * cfg.grad_accum * world,
        "gradient_clipping": 0.0,
        "zero_optimization": {"stage": 2, "overlap_comm": False, "contiguous_gradients": True,
                              "reduce_bucket_size": 500_000, "allgather_bucket_size": 500_000},
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }


def build_model(cfg):
    torch.manual_seed(cfg.seed)
    return nn.Sequential(
        nn.Linear(cfg.in_dim, cfg.hidden), nn.Tanh(), nn.Linear(cfg.hidden, cfg.hidden), nn.Tanh(), nn.Linear(cfg.hidden, 1)
    )


def batch_at(cfg, index, rank):
    g = torch.Generator().manual_seed(cfg.seed * 1000 + index * 2 + rank)
    x = torch.randn(cfg.micro_batch, cfg.in_dim, generator=g)
    y = torch.sin(x[:, :1] * 2.0) + 0.3 * x[:, 1:2] * x[:, 2:3]
    return x, y


class CheckpointedTrainer:
    def __init__(self, cfg, ckpt_dir):
        self.cfg = cfg
        self.ckpt_dir = ckpt_dir
        model = build_model(cfg)
        opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.0)
        self.engine, _, _, _ = deepspeed.initialize(
            model=model, optimizer=opt, config=ds_config(cfg, dist.get_world_size())
        )
        self.next_batch = 0

    def restore(self):
        _, client = self.engine.load_checkpoint(self.ckpt_dir, tag="last")
        self.next_batch = client["next_batch"]

    def save(self):
        self.engine.save_checkpoint(self.ckpt_dir, tag="last", client_state={"next_batch": self.next_batch})

    def run(self, stop_at):
        rank = dist.get_rank()
        while self.next_batch < stop_at:
            x, y = batch_at(self.cfg, self.next_batch, rank)
            loss = nn.functional.mse_loss(self.engine(x), y)
            self.engine.backward(loss)
            self.engine.step()
            self.next_batch += 1
            if self.next_batch % self.cfg.save_every == 0:
                self.save()


def digest(module):
    h = hashlib.sha256()
    for _, p in module.named_parameters():
        h.update(p.detach().float().contiguous().numpy().tobytes())
    return h.hexdigest()


def main():
    deepspeed.init_distributed(dist_backend="gloo")
    torch.use_deterministic_algorithms(True)
    cfg = TrainConfig()
    holder = [tempfile.mkdtemp(prefix="ds_ckpt_") if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(holder, src=0)
    ckpt_dir = holder[0]

    first = CheckpointedTrainer(cfg, ckpt_dir)
    first.run(stop_at=cfg.preempt_after)  # preempted here
    del first

    second = CheckpointedTrainer(cfg, ckpt_dir)
    second.restore()
    second.run(stop_at=cfg.total_batches)

    if dist.get_rank() == 0:
        print("FINAL_SHA256", digest(second.engine.module))
    dist.barrier()
    if dist.get_rank() == 0:
        shutil.rmtree(ckpt_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
