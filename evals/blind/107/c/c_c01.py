"""Bag-of-tokens classifier on a DeepSpeed ZeRO-2 engine with a frozen embedding table,
two AdamW parameter groups, a warm-up LambdaLR owned by the engine, clipping at 0.5, and a
save / reload into a freshly built engine halfway through (simulated pre-emption).

deepspeed --num_gpus 2 c_c01.py
"""
import hashlib
import os
import shutil
import tempfile
from types import SimpleNamespace

import deepspeed
import torch
import torch.nn as nn
import torch.nn.functional as F

CFG = SimpleNamespace(
    seed=11, vocab=64, dim=32, n_cls=4, seq=12, micro_batch=6, grad_accum=3,
    total_steps=10, preempt_at=4, lr=2e-3, warmup=3, weight_decay=0.05, clip=0.5,
)


class BagClassifier(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.emb = nn.Embedding(c.vocab, c.dim)
        self.emb.weight.requires_grad_(False)  # pretrained table, kept frozen
        self.proj = nn.Linear(c.dim, c.dim)
        self.norm = nn.LayerNorm(c.dim)
        self.cls = nn.Linear(c.dim, c.n_cls)

    def forward(self, tok):
        h = self.emb(tok).mean(1)
        return self.cls(self.norm(F.relu(self.proj(h))))


def micro_batch(c, rank, index):
    g = torch.Generator().manual_seed(c.seed * 7919 + rank * 104729 + index)
    tok = torch.randint(0, c.vocab, (c.micro_batch, c.seq), generator=g)
    y = (tok[:, :3].sum(1) % c.n_cls)
    return tok, y


def param_groups(model, wd):
    decay, no_decay = [], []
    for n, p in model.named_parameters():
        if not p.requires_grad:
            continue
        (no_decay if p.ndim < 2 else decay).append(p)
    return [{"params": decay, "weight_decay": wd}, {"params": no_decay, "weight_decay": 0.0}]


def build_engine(c, world):
    torch.manual_seed(c.seed)
    model = BagClassifier(c)
    opt = torch.optim.AdamW(param_groups(model, c.weight_decay), lr=c.lr)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / c.warmup))
    config = {
        "train_micro_batch_size_per_gpu": c.micro_batch,
        "gradient_accumulation_steps": c.grad_accum,
        "gradient_clipping": c.clip,
        "zero_optimization": {"stage": 2, "overlap_comm": False},
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 10**9,
    }
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, lr_scheduler=sched, config=config)
    return engine


def train_until(engine, c, rank, stop_step):
    micro = engine.global_steps * c.grad_accum
    while engine.global_steps < stop_step:
        tok, y = micro_batch(c, rank, micro)
        loss = F.cross_entropy(engine(tok), y)
        engine.backward(loss)
        engine.step()
        micro += 1
    if rank == 0:
        print(f"reached step {engine.global_steps} lr {engine.get_lr()[0]:.2e} loss {loss.item():.4f}", flush=True)


def sha256_params(module):
    h = hashlib.sha256()
    for _, p in module.named_parameters():
        h.update(p.detach().float().contiguous().cpu().numpy().tobytes())
    return h.hexdigest()


def main():
    c = CFG
    deepspeed.init_distributed(dist_backend="gloo")
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    ckpt_dir = os.path.join(tempfile.gettempdir(), "c_c01_ckpt_49204")
    if rank == 0:
        shutil.rmtree(ckpt_dir, ignore_errors=True)
    torch.distributed.barrier()

    engine = build_engine(c, world)
    train_until(engine, c, rank, c.preempt_at)
    engine.save_checkpoint(ckpt_dir, tag="preempt")
    del engine

    # "restart": a fresh engine picks up from the checkpoint (optimizer, scheduler, step count)
    engine = build_engine(c, world)
    engine.load_checkpoint(ckpt_dir, tag="preempt")
    train_until(engine, c, rank, c.total_steps)

    digest = sha256_params(engine.module)
    if rank == 0:
        print(f"FINAL_SHA256 {digest}", flush=True)
    torch.distributed.barrier()
    if rank == 0:
        shutil.rmtree(ckpt_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
