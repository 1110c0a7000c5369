"""ZeRO-1 classifier: frozen embedding, two AdamW groups, client warm-up handed to the engine,
a clip at 0.5 that acts, GA derived by DeepSpeed from train_batch_size, and a simulated
preemption: the run saves an engine checkpoint at an optimizer-step boundary, builds a fresh
model/optimizer/engine and resumes from it.
"""
import hashlib
import os
import shutil

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.distributed as dist
import deepspeed

SEED = 31
VOCAB, DIM, CLASSES, SEQ = 64, 24, 5, 10
MICRO = 4
K = 3
TOTAL_STEPS = 10
SAVE_AT = 4
CKPT = f"/tmp/b_c01_ckpt_{os.environ.get('MASTER_PORT', 'x')}"


class BagClassifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, DIM)
        self.emb.weight.requires_grad_(False)  # pretrained table, kept frozen
        self.proj = nn.Linear(DIM, DIM)
        self.ln = nn.LayerNorm(DIM)
        self.cls = nn.Linear(DIM, CLASSES)

    def forward(self, ids):
        h = self.emb(ids).mean(1)
        return self.cls(self.ln(F.gelu(self.proj(h))))


def param_groups(model):
    decay, no_decay = [], []
    for n, p in model.named_parameters():
        if not p.requires_grad:
            continue
        (no_decay if p.ndim < 2 else decay).append(p)
    return [{"params": decay, "weight_decay": 0.05}, {"params": no_decay, "weight_decay": 0.0}]


def config(world):
    return {
        "train_batch_size": MICRO * K * world,
        "train_micro_batch_size_per_gpu": MICRO,
        "gradient_clipping": 0.5,
        "zero_optimization": {"stage": 1},
        "steps_per_print": 100000,
    }


def build(world):
    torch.manual_seed(SEED)
    model = BagClassifier()
    opt = torch.optim.AdamW(param_groups(model), lr=4e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 3))
    engine, _, _, sched = deepspeed.initialize(model=model, optimizer=opt, lr_scheduler=sched,
                                               config=config(world))
    return engine, sched


def micro_batch(rank, idx):
    g = torch.Generator().manual_seed(SEED * 1000 + 97 * idx + rank)
    ids = torch.randint(0, VOCAB, (MICRO, SEQ), generator=g)
    y = (ids[:, 0] + ids[:, 1]) % CLASSES
    return ids, y


def run(engine, rank, first_step, last_step):
    gas = engine.gradient_accumulation_steps()
    for step in range(first_step, last_step):
        for j in range(gas):
            ids, y = micro_batch(rank, step * gas + j)
            loss = F.cross_entropy(engine(ids), y)
            engine.backward(loss)
            engine.step()


def main():
    deepspeed.init_distributed(dist_backend="gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    engine, _ = build(world)
    assert engine.gradient_accumulation_steps() == K
    run(engine, rank, 0, SAVE_AT)
    engine.save_checkpoint(CKPT, tag="preempt")
    dist.barrier()
    del engine

    engine, sched = build(world)  # fresh objects, then restore
    engine.load_checkpoint(CKPT, tag="preempt")
    run(engine, rank, engine.global_steps, TOTAL_STEPS)
    assert engine.global_steps == TOTAL_STEPS

    h = hashlib.sha256()
    for _, p in engine.module.named_parameters():
        h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
    dist.barrier()
    if rank == 0:
        shutil.rmtree(CKPT, ignore_errors=True)
        print(f"FINAL_SHA256 {h.hexdigest()}")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
