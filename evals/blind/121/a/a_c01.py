"""Bag-of-embeddings sentiment model on DeepSpeed ZeRO-3.

The pretrained-style embedding table is frozen; the rest trains with a client AdamW
of two groups (no decay on biases/LayerNorm) and a client warm-up LambdaLR that the
engine steps at each accumulation boundary.  GA 3, clip 0.5.
"""
import hashlib
import math

import deepspeed
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

VOCAB, DIM, SEQ = 300, 32, 12
MICRO, GA, EPOCHS, WINDOWS_PER_EPOCH = 8, 3, 3, 4


class BagModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.proj = nn.Linear(DIM, 64)
        self.norm = nn.LayerNorm(64)
        self.out = nn.Linear(64, 2)

    def forward(self, ids):
        h = self.embed(ids).mean(1)
        return self.out(self.norm(F.gelu(self.proj(h))))


def param_groups(model, wd=0.05):
    decay, no_decay = [], []
    for n, p in model.named_parameters():
        if not p.requires_grad:
            continue
        (no_decay if n.endswith("bias") or "norm" in n else decay).append(p)
    return [{"params": decay, "weight_decay": wd}, {"params": no_decay, "weight_decay": 0.0}]


def warmup_then_flat(step, warmup=4):
    return min(1.0, (step + 1) / warmup)


def main():
    deepspeed.init_distributed(dist_backend="gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(11)
    model = BagModel()
    model.embed.weight.requires_grad_(False)
    opt = torch.optim.AdamW(param_groups(model), lr=5e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, warmup_then_flat)
    cfg = {
        "train_micro_batch_size_per_gpu": MICRO,
        "gradient_accumulation_steps": GA,
        "gradient_clipping": 0.5,
        "zero_allow_untested_optimizer": True,
        "zero_optimization": {
            "stage": 3,
            "reduce_bucket_size": 200_000,
            "stage3_prefetch_bucket_size": 200_000,
            "stage3_param_persistence_threshold": 0,
        },
        "steps_per_print": 10_000,
    }
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, lr_scheduler=sched, config=cfg)

    g = torch.Generator().manual_seed(1000 + rank)
    n = WINDOWS_PER_EPOCH * GA * MICRO
    ids = torch.randint(0, VOCAB, (n, SEQ), generator=g)
    labels = ((ids < VOCAB // 3).sum(1) > SEQ // 3).long()

    for epoch in range(EPOCHS):
        perm = torch.randperm(n, generator=torch.Generator().manual_seed(epoch * 10 + rank))
        for i in range(0, n, MICRO):
            idx = perm[i:i + MICRO]
            loss = F.cross_entropy(engine(ids[idx]), labels[idx])
            engine.backward(loss)
            engine.step()

    params = list(engine.module.parameters())
    h = hashlib.sha256()
    with deepspeed.zero.GatheredParameters(params, modifier_rank=None):
        for _, p in engine.module.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
    if rank == 0:
        print(f"optimizer steps {engine.global_steps}, lr {sched.get_last_lr()}")
        print(f"FINAL_SHA256 {h.hexdigest()}")
    dist.barrier()


if __name__ == "__main__":
    main()
