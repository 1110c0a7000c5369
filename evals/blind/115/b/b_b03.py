"""Click-through-rate regression on DeepSpeed ZeRO-3, pre-empted and resumed.

The optimizer (Adam) and the schedule (WarmupCosineLR) are owned by the engine,
built from a dict config. After `PREEMPT_AT` optimizer steps the job checkpoints
(with the data position in `client_state`) and exits; a fresh engine is then built,
reloads the checkpoint and carries on to `TOTAL_STEPS`.
"""
import argparse
import hashlib
import os
import shutil
import tempfile

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
import deepspeed
from deepspeed.utils import safe_get_full_fp32_param

N_USERS, N_ITEMS, N_DENSE, DIM = 64, 48, 6, 16


def ds_config(args):
    return {
        "train_micro_batch_size_per_gpu": args.micro_batch,
        "gradient_accumulation_steps": args.grad_accum,
        "gradient_clipping": 0.0,
        "steps_per_print": 10_000,
        "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},
        "optimizer": {"type": "Adam",
                      "params": {"lr": args.lr, "betas": [0.9, 0.99], "eps": 1e-8,
                                 "weight_decay": 0.0, "torch_adam": True}},
        "scheduler": {"type": "WarmupCosineLR",
                      "params": {"total_num_steps": args.total_steps, "warmup_num_steps": 2,
                                 "warmup_min_ratio": 0.1, "cos_min_ratio": 0.05}},
    }


class CTRModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.user = nn.Embedding(N_USERS, DIM)
        self.item = nn.Embedding(N_ITEMS, DIM)
        self.dense = nn.Linear(N_DENSE, DIM)
        self.tower = nn.Sequential(nn.Linear(3 * DIM, 32), nn.ReLU(), nn.Linear(32, 1))

    def forward(self, u, it, x):
        z = torch.cat([self.user(u), self.item(it), self.dense(x)], -1)
        return self.tower(z).squeeze(-1)


def make_batches(args, rank, world):
    g = torch.Generator().manual_seed(2024)
    n = args.total_steps * args.grad_accum * args.micro_batch * world
    u = torch.randint(0, N_USERS, (n,), generator=g)
    it = torch.randint(0, N_ITEMS, (n,), generator=g)
    x = torch.randn(n, N_DENSE, generator=g)
    logit = 0.8 * torch.sin(u.float()) - 0.5 * torch.cos(it.float() * 0.7) + x[:, 0] - 0.3 * x[:, 3]
    y = (torch.rand(n, generator=g) < torch.sigmoid(logit)).float()
    sl = slice(rank, None, world)
    return list(zip(u[sl].split(args.micro_batch), it[sl].split(args.micro_batch),
                    x[sl].split(args.micro_batch), y[sl].split(args.micro_batch)))


def build_engine(args):
    torch.manual_seed(args.seed)
    model = CTRModel()
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                           config=ds_config(args))
    return engine


def train(engine, batches, start, stop_at_step=None, ckpt_dir=None):
    """Runs micro-batches from `start`; returns True if it pre-empted."""
    engine.train()
    for i in range(start, len(batches)):
        u, it, x, y = batches[i]
        loss = F.binary_cross_entropy_with_logits(engine(u, it, x), y)
        engine.backward(loss)
        engine.step()
        if stop_at_step is not None and engine.global_steps == stop_at_step:
            engine.save_checkpoint(ckpt_dir, tag="preempt", client_state={"consumed": i})
            return True
    return False


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--local_rank", type=int, default=-1)
    p.add_argument("--micro_batch", type=int, default=8)
    p.add_argument("--grad_accum", type=int, default=3)
    p.add_argument("--total_steps", type=int, default=10)
    p.add_argument("--preempt_at", type=int, default=4)
    p.add_argument("--lr", type=float, default=5e-3)
    p.add_argument("--seed", type=int, default=3)
    args = p.parse_args()

    deepspeed.init_distributed(dist_backend="gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    holder = [tempfile.mkdtemp(prefix="ctr_ckpt_") if rank == 0 else None]
    dist.broadcast_object_list(holder, src=0)
    ckpt_dir = holder[0]

    batches = make_batches(args, rank, world)

    # first job: runs until pre-emption
    engine = build_engine(args)
    assert train(engine, batches, 0, stop_at_step=args.preempt_at, ckpt_dir=ckpt_dir)
    del engine

    # second job: fresh engine, reload, continue
    engine = build_engine(args)
    _, client_state = engine.load_checkpoint(ckpt_dir, tag="preempt")
    train(engine, batches, start=client_state["consumed"])
    assert engine.global_steps == args.total_steps, engine.global_steps

    full = {n: safe_get_full_fp32_param(q).detach().float().cpu().contiguous()
            for n, q in engine.module.named_parameters()}
    h = hashlib.sha256()
    for t in full.values():
        h.update(t.numpy().tobytes())
    dist.barrier()
    if rank == 0:
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
        if os.environ.get("PARAM_DUMP"):
            torch.save(full, os.environ["PARAM_DUMP"])
        shutil.rmtree(ckpt_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
