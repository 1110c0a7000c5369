"""ZeRO-3 bag-of-tokens classifier: a frozen embedding table, AdamW with a
decay and a no-decay group, K = 3 owned by the engine, a clip of 0.5 and a
client warm-up schedule that the engine steps at each boundary."""
import hashlib
from types import SimpleNamespace

import deepspeed
import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

H = SimpleNamespace(seed=21, vocab=50, dim=24, classes=5, seq=10, micro=4, accum=3,
                    steps=8, lr=4e-3, warmup=3, clip=0.5)


class BagClassifier(nn.Module):
    def __init__(self, h):
        super().__init__()
        self.emb = nn.Embedding(h.vocab, h.dim)
        self.emb.weight.requires_grad_(False)
        self.proj = nn.Linear(h.dim, 64)
        self.norm = nn.LayerNorm(64)
        self.cls = nn.Linear(64, h.classes)

    def forward(self, tok):
        h = self.emb(tok).mean(1)
        return self.cls(self.norm(F.gelu(self.proj(h))))


def param_groups(model, wd=0.05):
    decay, no_decay = [], []
    for n, p in model.named_parameters():
        if not p.requires_grad:
            continue
        (no_decay if p.ndim < 2 else decay).append(p)
    return [{"params": decay, "weight_decay": wd}, {"params": no_decay, "weight_decay": 0.0}]


def make_batches(h, rank, world):
    g = torch.Generator().manual_seed(h.seed + 1)
    n = h.steps * h.accum * world
    tok = torch.randint(0, h.vocab, (n, h.micro, h.seq), generator=g)
    lab = (tok[..., :3].sum(-1) + tok[..., -1]) % h.classes
    return tok[rank::world], lab[rank::world]


def main():
    deepspeed.init_distributed(dist_backend="gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(H.seed)
    model = BagClassifier(H)
    opt = torch.optim.AdamW(param_groups(model), lr=H.lr)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / H.warmup))
    cfg = {
        "train_micro_batch_size_per_gpu": H.micro,
        "gradient_accumulation_steps": H.accum,
        "train_batch_size": H.micro * H.accum * world,
        "gradient_clipping": H.clip,
        "zero_allow_untested_optimizer": True,
        "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},
        "steps_per_print": 10_000,
    }
    engine, _, _, sched = deepspeed.initialize(model=model, optimizer=opt, lr_scheduler=sched,
                                               config=cfg)
    tok, lab = make_batches(H, rank, world)
    for i in range(tok.shape[0]):
        loss = F.cross_entropy(engine(tok[i]), lab[i])
        engine.backward(loss)
        engine.step()
        if rank == 0 and (i + 1) % (3 * H.accum) == 0:
            print(f"micro {i + 1} loss {loss.item():.4f}", flush=True)

    params = [p for _, p in engine.module.named_parameters()]
    with deepspeed.zero.GatheredParameters(params, modifier_rank=None):
        flat = torch.cat([p.detach().float().reshape(-1) for _, p in engine.module.named_parameters()])
        digest = hashlib.sha256(flat.numpy().astype(np.float32).tobytes()).hexdigest()
    if rank == 0:
        print(f"FINAL_SHA256 {digest}", flush=True)


if __name__ == "__main__":
    main()
