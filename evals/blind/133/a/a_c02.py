"""DeepSpeed ZeRO-1 trainer with the accumulation in the engine config (K = 3),
a frozen embedding table, two AdamW parameter groups, a clip at 0.5 that
acts, and a client warm-up LambdaLR handed to the engine (stepped once per
optimizer step). Half-way through, the run is checkpointed at a step boundary,
the engine is torn down, and training resumes in a freshly built engine.
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

CONFIG = {
    "train_micro_batch_size_per_gpu": 4,
    "gradient_accumulation_steps": 3,
    "gradient_clipping": 0.5,
    "zero_optimization": {"stage": 1},
    "steps_per_print": 100000,
}
TOTAL_STEPS = 8
RESUME_AT = 4
WARMUP = 3


class BagClassifier(nn.Module):
    def __init__(self, vocab=50, dim=24, n_cls=5):
        super().__init__()
        self.table = nn.Embedding(vocab, dim)
        self.table.weight.requires_grad_(False)
        self.proj = nn.Linear(dim, dim)
        self.norm = nn.LayerNorm(dim)
        self.classifier = nn.Linear(dim, n_cls)

    def forward(self, ids):
        h = self.table(ids).mean(1)
        return self.classifier(self.norm(torch.relu(self.proj(h))))


def build_engine(seed):
    torch.manual_seed(seed)
    model = BagClassifier()
    decay = [p for n, p in model.named_parameters() if p.requires_grad and p.dim() > 1]
    no_decay = [p for n, p in model.named_parameters() if p.requires_grad and p.dim() <= 1]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}], lr=5e-3
    )
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / WARMUP))
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, lr_scheduler=sched, config=CONFIG)
    return engine


def micro_batch(rank, micro_index, vocab=50, n_cls=5, rows=4, length=10):
    g = torch.Generator().manual_seed(10_000 * rank + micro_index)
    ids = torch.randint(0, vocab, (rows, length), generator=g)
    y = (ids[:, 0] + ids[:, 1]) % n_cls
    return ids, y


def train_steps(engine, rank, first_step, last_step):
    k = engine.gradient_accumulation_steps()
    for step in range(first_step, last_step):
        for j in range(k):
            ids, y = micro_batch(rank, step * k + j)
            loss = F.cross_entropy(engine(ids), y)
            engine.backward(loss)
            engine.step()
        if rank == 0:
            print(f"step {engine.global_steps} lr {engine.get_lr()[0]:.5f} norm {engine.get_global_grad_norm():.3f}", flush=True)


def digest(engine):
    h = hashlib.sha256()
    for _, p in engine.module.named_parameters():
        h.update(p.detach().float().contiguous().numpy().tobytes())
    return h.hexdigest()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--local_rank", type=int, default=-1)
    ap.add_argument("--seed", type=int, default=3)
    args = ap.parse_args()
    deepspeed.init_distributed(dist_backend="gloo")
    torch.use_deterministic_algorithms(True)
    rank = dist.get_rank()

    holder = [tempfile.mkdtemp(prefix="a_c02_ckpt_") if rank == 0 else None]
    dist.broadcast_object_list(holder, src=0)
    ckpt_dir = holder[0]

    engine = build_engine(args.seed)
    train_steps(engine, rank, 0, RESUME_AT)
    engine.save_checkpoint(ckpt_dir, tag="mid")
    dist.barrier()
    del engine

    engine = build_engine(args.seed + 1)  # different init: everything must come from the checkpoint
    engine.load_checkpoint(ckpt_dir, tag="mid")
    assert engine.global_steps == RESUME_AT
    train_steps(engine, rank, RESUME_AT, TOTAL_STEPS)

    d = digest(engine)
    dist.barrier()
    if rank == 0:
        shutil.rmtree(ckpt_dir, ignore_errors=True)
        print(f"FINAL_SHA256 {d}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
