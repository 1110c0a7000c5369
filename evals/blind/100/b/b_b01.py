"""ZeRO-2 tagger with preemption-safe checkpoints.

The cluster kills jobs without notice, so the trainer writes a DeepSpeed
checkpoint every `ckpt_every` micro-batches and, on restart, reloads it into a
freshly built engine and carries on from the saved micro-batch position.
Here the kill is simulated right after the first checkpoint.
"""
import hashlib
import os
import shutil
import tempfile
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
import deepspeed


@dataclass
class RunConfig:
    vocab: int = 64
    dim: int = 32
    n_cls: int = 5
    seq: int = 12
    micro_bs: int = 4
    grad_accum: int = 2
    n_micro: int = 16          # micro-batches per rank for the whole run
    lr: float = 3e-3
    warmup: int = 4            # optimizer steps
    ckpt_every: int = 5        # micro-batches between checkpoints
    seed: int = 1234


class Tagger(nn.Module):
    def __init__(self, c: RunConfig):
        super().__init__()
        self.emb = nn.Embedding(c.vocab, c.dim)
        self.mix = nn.Sequential(nn.Linear(c.dim, 64), nn.GELU(), nn.Linear(64, c.dim))
        self.head = nn.Linear(c.dim, c.n_cls)

    def forward(self, ids, labels):
        h = self.emb(ids)
        h = h + self.mix(h)
        return F.cross_entropy(self.head(h.mean(1)), labels)


def make_shard(c: RunConfig, rank: int):
    g = torch.Generator().manual_seed(1000 + rank)
    ids = torch.randint(0, c.vocab, (c.n_micro, c.micro_bs, c.seq), generator=g)
    labels = ids[..., :3].sum(-1) % c.n_cls
    return ids, labels


def ds_config(c: RunConfig):
    return {
        "train_micro_batch_size_per_gpu": c.micro_bs,
        "gradient_accumulation_steps": c.grad_accum,
        "gradient_clipping": 0.0,
        "zero_optimization": {"stage": 2, "reduce_bucket_size": 200000, "allgather_bucket_size": 200000},
        "steps_per_print": 10**6,
        "wall_clock_breakdown": False,
    }


def build_engine(c: RunConfig, init_seed: int):
    torch.manual_seed(init_seed)
    model = Tagger(c)
    opt = torch.optim.AdamW(model.parameters(), lr=c.lr, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / c.warmup))
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, lr_scheduler=sched,
                                           config=ds_config(c))
    return engine


def train(engine, shard, c: RunConfig, start: int, ckpt_dir: str, preempt: bool):
    ids, labels = shard
    for i in range(start, c.n_micro):
        loss = engine(ids[i], labels[i])
        engine.backward(loss)
        engine.step()
        if (i + 1) % c.ckpt_every == 0:
            engine.save_checkpoint(ckpt_dir, tag="preempt", client_state={"next_micro": i + 1})
            if preempt:
                return i + 1
    return c.n_micro


def report(named_params):
    h = hashlib.sha256()
    for _, p in named_params:
        h.update(p.detach().float().contiguous().cpu().numpy().tobytes())
    print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)


def main():
    c = RunConfig()
    deepspeed.init_distributed(dist_backend="gloo")
    rank = dist.get_rank()
    torch.use_deterministic_algorithms(True)
    shard = make_shard(c, rank)

    holder = [tempfile.mkdtemp(prefix="b_b01_") if rank == 0 else None]
    dist.broadcast_object_list(holder, src=0)
    ckpt_dir = holder[0]

    engine = build_engine(c, c.seed)
    train(engine, shard, c, 0, ckpt_dir, preempt=True)
    del engine

    # "restart": a fresh engine from other random weights, state from the checkpoint
    engine = build_engine(c, c.seed + 99)
    _, client = engine.load_checkpoint(ckpt_dir, tag="preempt")
    train(engine, shard, c, client["next_micro"], ckpt_dir, preempt=False)

    dist.barrier()
    if rank == 0:
        report(engine.module.named_parameters())
        shutil.rmtree(ckpt_dir, ignore_errors=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
