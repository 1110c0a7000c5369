"""ZeRO-1 trainer for a bag-of-embeddings classifier: the pretrained-style embedding table is
frozen, the rest trains in two AdamW groups (no decay on biases/norms); K = 3 lives in the
DeepSpeed config, a WarmupLR schedule is stepped by the engine, and clipping at 0.3 is set
explicitly (it acts)."""
import hashlib
import sys
from dataclasses import dataclass, asdict

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
import deepspeed


@dataclass
class Hparams:
    vocab: int = 80
    dim: int = 32
    seq: int = 10
    classes: int = 4
    micro: int = 5
    accum: int = 3
    updates: int = 9
    lr: float = 4e-3
    warmup: int = 4
    clip: float = 0.3
    seed: int = 11


class BagClassifier(nn.Module):
    def __init__(self, hp):
        super().__init__()
        self.emb = nn.Embedding(hp.vocab, hp.dim)
        self.norm = nn.LayerNorm(hp.dim)
        self.mlp = nn.Sequential(nn.Linear(hp.dim, 64), nn.GELU(), nn.Linear(64, hp.classes))

    def forward(self, ids):
        return self.mlp(self.norm(self.emb(ids).mean(1)))


def build_engine(hp, world):
    torch.manual_seed(hp.seed)
    model = BagClassifier(hp)
    model.emb.weight.requires_grad_(False)
    trainable = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    groups = [
        {"params": [p for n, p in trainable if p.dim() > 1], "weight_decay": 0.05},
        {"params": [p for n, p in trainable if p.dim() <= 1], "weight_decay": 0.0},
    ]
    opt = torch.optim.AdamW(groups, lr=hp.lr)
    config = {
        "train_batch_size": hp.micro * hp.accum * world,
        "train_micro_batch_size_per_gpu": hp.micro,
        "gradient_clipping": hp.clip,
        "zero_optimization": {"stage": 1},
        "zero_allow_untested_optimizer": True,
        "scheduler": {"type": "WarmupLR",
                      "params": {"warmup_min_lr": 0.0, "warmup_max_lr": hp.lr,
                                 "warmup_num_steps": hp.warmup, "warmup_type": "linear"}},
        "steps_per_print": 10 ** 6,
    }
    engine, _, _, sched = deepspeed.initialize(model=model, optimizer=opt, config=config)
    return engine, sched


def data(hp, world):
    g = torch.Generator().manual_seed(hp.seed + 3)
    n = hp.micro * hp.accum * world * hp.updates
    ids = torch.randint(0, hp.vocab, (n, hp.seq), generator=g)
    y = (ids % hp.classes == 0).sum(1).clamp(max=hp.classes - 1)
    return ids, y


def main():
    hp = Hparams()
    deepspeed.init_distributed(dist_backend="gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    engine, sched = build_engine(hp, world)
    ids, y = data(hp, world)
    n_micro = hp.accum * hp.updates
    for j in range(n_micro):
        lo = (j * world + rank) * hp.micro
        loss = F.cross_entropy(engine(ids[lo:lo + hp.micro]), y[lo:lo + hp.micro])
        engine.backward(loss)
        engine.step()
        if rank == 0 and engine.is_gradient_accumulation_boundary() is False and j % 9 == 8:
            print(f"micro {j} loss {loss.item():.4f} lr {sched.get_last_lr()[0]:.5f}", flush=True)
    h = hashlib.sha256()
    for _, p in engine.module.named_parameters():
        h.update(p.detach().float().contiguous().numpy().tobytes())
    if rank == 0:
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
    dist.barrier()


if __name__ == "__main__":
    main()
