"""DeepSpeed stage-0 (plain data parallel) trainer that owns its accumulation.

The engine is configured with gradient_accumulation_steps = 1, so every
engine.step() is an update.  The loop accumulates K micro-batches itself:
the first K-1 backwards run under engine.no_sync() (no all-reduce, gradients
stay in .grad), the last one all-reduces the accumulated .grad, then one
engine.step() applies the clip, the client optimizer and the client schedule.
Since the engine does not divide by K here, the loop does.

Halfway through, the run checkpoints at an update boundary and continues in a
freshly built engine loaded from that checkpoint.
"""
import argparse
import contextlib
import hashlib
import shutil
import tempfile

import deepspeed
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F


def parse():
    p = argparse.ArgumentParser()
    p.add_argument("--accum", type=int, default=3)
    p.add_argument("--micro-bs", type=int, default=6)
    p.add_argument("--updates", type=int, default=18)
    p.add_argument("--restart-at", type=int, default=8)
    p.add_argument("--clip", type=float, default=0.3)
    p.add_argument("--lr", type=float, default=1e-2)
    p.add_argument("--seed", type=int, default=31)
    p.add_argument("--local_rank", type=int, default=-1)
    return p.parse_args()


def ds_config(a):
    return {
        "train_micro_batch_size_per_gpu": a.micro_bs,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": a.clip,
        "zero_optimization": {"stage": 0},
        "steps_per_print": 1_000_000,
    }


class SeqRegressor(nn.Module):
    def __init__(self, vocab=32, dim=24, seq=8):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(torch.randn(seq, dim) * 0.1, requires_grad=False)   # fixed table
        self.rnn = nn.GRU(dim, dim, batch_first=True)
        self.out = nn.Linear(dim, 1)

    def forward(self, x):
        h, _ = self.rnn(self.emb(x) + self.pos)
        return self.out(h[:, -1]).squeeze(-1)


def make_engine(a):
    torch.manual_seed(a.seed)
    model = SeqRegressor()
    trainable = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.Adam(trainable, lr=a.lr)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=5, gamma=0.5)
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, lr_scheduler=sched,
                                           model_parameters=trainable, config=ds_config(a))
    return engine


def shard(a, rank, world):
    g = torch.Generator().manual_seed(a.seed + 3)
    n = a.updates * a.accum * a.micro_bs * world
    x = torch.randint(0, 32, (n, 8), generator=g)
    y = torch.sin(x.float()).sum(1) / 4
    x, y = x[rank::world], y[rank::world]
    return list(zip(x.split(a.micro_bs), y.split(a.micro_bs)))


def train_updates(engine, data, a, first, last):
    for u in range(first, last):
        window = data[u * a.accum:(u + 1) * a.accum]
        for j, (x, y) in enumerate(window):
            ctx = engine.no_sync() if j < len(window) - 1 else contextlib.nullcontext()
            with ctx:
                loss = F.smooth_l1_loss(engine(x), y) / a.accum
                engine.backward(loss)
        engine.step()


def main():
    a = parse()
    deepspeed.init_distributed(dist_backend="gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    data = shard(a, rank, world)

    box = [tempfile.mkdtemp(prefix="ds0_") if rank == 0 else None]
    dist.broadcast_object_list(box, src=0)
    ckpt = box[0]

    engine = make_engine(a)
    train_updates(engine, data, a, 0, a.restart_at)
    engine.save_checkpoint(ckpt, tag="restart")
    dist.barrier()
    del engine

    engine = make_engine(a)
    engine.load_checkpoint(ckpt, tag="restart")
    train_updates(engine, data, a, a.restart_at, a.updates)

    if rank == 0:
        flat = torch.cat([p.detach().float().reshape(-1) for _, p in engine.module.named_parameters()])
        print(f"FINAL_SHA256 {hashlib.sha256(flat.numpy().tobytes()).hexdigest()}", flush=True)
        shutil.rmtree(ckpt, ignore_errors=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
