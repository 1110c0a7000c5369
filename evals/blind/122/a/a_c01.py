"""Token classifier on DeepSpeed ZeRO-1 with the accumulation derived from train_batch_size.

Frozen embedding table, a client AdamW with two groups (no decay on norms/biases),
a config WarmupLR, clipping at 0.5 and a DataLoader with one worker.
"""
import hashlib

import deepspeed
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

SEED = 2024
VOCAB, DIM, SEQ, NTAG = 64, 32, 12, 6
MICRO_BS, ACCUM, STEPS = 4, 3, 8


class Tagger(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, DIM)
        self.emb.weight.requires_grad_(False)
        self.rnn = nn.GRU(DIM, DIM, batch_first=True)
        self.norm = nn.LayerNorm(DIM)
        self.head = nn.Linear(DIM, NTAG)

    def forward(self, ids):
        h, _ = self.rnn(self.emb(ids))
        return self.head(self.norm(h))


def param_groups(model, wd):
    decay, no_decay = [], []
    for n, p in model.named_parameters():
        if not p.requires_grad:
            continue
        (no_decay if p.ndim < 2 or "norm" in n else decay).append(p)
    return [{"params": decay, "weight_decay": wd}, {"params": no_decay, "weight_decay": 0.0}]


def main():
    deepspeed.init_distributed(dist_backend="gloo")
    world, rank = dist.get_world_size(), dist.get_rank()
    torch.manual_seed(SEED)
    model = Tagger()
    opt = torch.optim.AdamW(param_groups(model, 0.05), lr=4e-3)
    cfg = {
        "train_batch_size": MICRO_BS * ACCUM * world,
        "train_micro_batch_size_per_gpu": MICRO_BS,
        "gradient_clipping": 0.5,
        "zero_optimization": {"stage": 1},
        "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0.0, "warmup_max_lr": 4e-3,
                                                     "warmup_num_steps": 3, "warmup_type": "linear"}},
        "steps_per_print": 10_000,
    }
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, config=cfg)
    assert engine.gradient_accumulation_steps() == ACCUM

    g = torch.Generator().manual_seed(SEED + 5)
    n = STEPS * ACCUM * world * MICRO_BS
    ids = torch.randint(0, VOCAB, (n, SEQ), generator=g)
    tags = (ids + torch.roll(ids, 1, dims=1)) % NTAG
    ds = TensorDataset(ids, tags)
    sampler = DistributedSampler(ds, num_replicas=world, rank=rank, shuffle=True, seed=SEED)
    loader = DataLoader(ds, batch_size=MICRO_BS, sampler=sampler, num_workers=1,
                        persistent_workers=False)
    engine.train()
    for x, y in loader:
        logits = engine(x)
        loss = F.cross_entropy(logits.reshape(-1, NTAG), y.reshape(-1))
        engine.backward(loss)
        engine.step()
    assert engine.global_steps == STEPS

    h = hashlib.sha256()
    for _, p in engine.module.named_parameters():
        h.update(p.detach().float().contiguous().numpy().tobytes())
    if rank == 0:
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
    dist.barrier()


if __name__ == "__main__":
    main()
