"""DeepSpeed ZeRO-3 trainer: K = 3 owned by the engine, a frozen embedding, two parameter groups,
a client warm-up LambdaLR handed to the engine (stepped once per update), an explicit clip that acts."""
import hashlib
import os

import deepspeed
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

K = 3
MICRO = 4
UPDATES = 12
WARMUP = 4


def ds_config():
    return {
        "train_micro_batch_size_per_gpu": MICRO,
        "gradient_accumulation_steps": K,
        "gradient_clipping": 0.1,
        "zero_allow_untested_optimizer": True,
        "zero_optimization": {
            "stage": 3,
            "overlap_comm": False,
            "contiguous_gradients": False,
            "reduce_bucket_size": 200_000,
            "stage3_prefetch_bucket_size": 200_000,
            "stage3_param_persistence_threshold": 0,
            "stage3_max_live_parameters": 1_000_000,
        },
        "steps_per_print": 100_000,
    }


class Tagger(nn.Module):
    def __init__(self, vocab=50, dim=32, n_tags=6):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.enc = nn.Sequential(nn.Linear(dim, 64), nn.ReLU(), nn.Linear(64, dim))
        self.norm = nn.LayerNorm(dim)
        self.cls = nn.Linear(dim, n_tags)

    def forward(self, ids):
        h = self.emb(ids)
        h = self.norm(h + self.enc(h))
        return self.cls(h.mean(1))


def build_optimizer(model):
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        (no_decay if p.ndim == 1 else decay).append(p)
    return torch.optim.AdamW([{"params": decay, "weight_decay": 0.05},
                              {"params": no_decay, "weight_decay": 0.0}], lr=4e-3)


def main():
    deepspeed.init_distributed(dist_backend="gloo")
    torch.use_deterministic_algorithms(True)
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(5)
    model = Tagger()
    model.emb.weight.requires_grad_(False)  # keep the (pretend) pretrained table frozen
    opt = build_optimizer(model)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / WARMUP))
    engine, _, _, lr_sched = deepspeed.initialize(model=model, optimizer=opt, lr_scheduler=sched,
                                                  config=ds_config())
    assert engine.gradient_accumulation_steps() == K

    g = torch.Generator().manual_seed(5)
    n = world * MICRO * K * UPDATES
    ids = torch.randint(0, 50, (n, 10), generator=g)
    tags = (ids[:, 0] + ids[:, -1]) % 6
    ds = TensorDataset(ids, tags)
    sampler = DistributedSampler(ds, shuffle=True, seed=5)
    loader = DataLoader(ds, batch_size=MICRO, sampler=sampler)

    for ids_b, tag_b in loader:
        loss = F.cross_entropy(engine(ids_b), tag_b)
        engine.backward(loss)
        engine.step()
    assert engine.global_steps == UPDATES

    parts = []
    params = [p for _, p in engine.module.named_parameters()]
    with deepspeed.zero.GatheredParameters(params, modifier_rank=None):
        for _, p in engine.module.named_parameters():
            parts.append(p.detach().float().reshape(-1).clone())
    flat = torch.cat(parts)
    if rank == 0:
        print(f"FINAL_SHA256 {hashlib.sha256(flat.numpy().tobytes()).hexdigest()}")


if __name__ == "__main__":
    main()
