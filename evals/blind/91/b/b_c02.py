"""DeepSpeed ZeRO-1 classifier with a frozen embedding, two AdamW groups, a client warm-up
schedule stepped by the engine, an explicit clip, and a stop/resume into a fresh engine."""
import hashlib
import json
import os
import shutil

import deepspeed
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
CKPT = os.path.join(HERE, "_ckpt_b_c02")

DS_CONFIG = json.loads("""
{
  "train_micro_batch_size_per_gpu": 6,
  "gradient_accumulation_steps": 3,
  "gradient_clipping": 0.5,
  "zero_optimization": {"stage": 1, "reduce_bucket_size": 20000},
  "zero_allow_untested_optimizer": true,
  "steps_per_print": 100000
}
""")
TOTAL_STEPS = 10
RESUME_AT = 4
N_CLASSES = 5


class BagClassifier(nn.Module):
    def __init__(self, vocab=40, dim=16):
        super().__init__()
        self.emb = nn.EmbeddingBag(vocab, dim, mode="mean")
        self.emb.weight.requires_grad_(False)
        self.proj = nn.Linear(dim, 32)
        self.norm = nn.LayerNorm(32)
        self.cls = nn.Linear(32, N_CLASSES)

    def forward(self, tokens):
        return self.cls(self.norm(F.gelu(self.proj(self.emb(tokens)))))


def build(seed=11):
    torch.manual_seed(seed)
    model = BagClassifier()
    decay, no_decay = [], []
    for n, p in model.named_parameters():
        if not p.requires_grad:
            continue
        (no_decay if p.ndim < 2 else decay).append(p)
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.05},
                             {"params": no_decay, "weight_decay": 0.0}], lr=4e-3)
    warm = 3
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warm) * max(0.1, 1 - s / TOTAL_STEPS))
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, lr_scheduler=sched,
                                           config=DS_CONFIG)
    return engine


def micro_batch(rank, step, j):
    g = torch.Generator().manual_seed(rank * 10_000 + step * 100 + j)
    toks = torch.randint(0, 40, (6, 7), generator=g)
    labels = (toks[:, :3].sum(-1) % N_CLASSES)
    return toks, labels


def run(engine, rank, first, last):
    ga = engine.gradient_accumulation_steps()
    for step in range(first, last):
        for j in range(ga):
            x, y = micro_batch(rank, step, j)
            loss = F.cross_entropy(engine(x), y)
            engine.backward(loss)
            engine.step()


def fingerprint(module):
    h = hashlib.sha256()
    for _, p in module.named_parameters():
        h.update(p.detach().float().contiguous().numpy().tobytes())
    return h.hexdigest()


def main():
    deepspeed.init_distributed(dist_backend="gloo")
    rank = dist.get_rank()
    engine = build()
    run(engine, rank, 0, RESUME_AT)
    engine.save_checkpoint(CKPT, tag="resume")
    dist.barrier()
    del engine

    engine = build(seed=99)  # fresh objects; the checkpoint restores everything
    engine.load_checkpoint(CKPT, tag="resume")
    run(engine, rank, RESUME_AT, TOTAL_STEPS)

    fp = fingerprint(engine.module)
    dist.barrier()
    if rank == 0:
        shutil.rmtree(CKPT, ignore_errors=True)
        print(f"FINAL_SHA256 {fp}", flush=True)
    dist.barrier()


if __name__ == "__main__":
    main()
