"""Sentiment regression head on a frozen-embedding encoder, DeepSpeed ZeRO-2.

The accumulation is the engine's: the config gives only `train_batch_size` and
`train_micro_batch_size_per_gpu`, so DeepSpeed derives GA = 32 / (4 x 2 ranks) = 4.
A client AdamW with two parameter groups (no decay on norms/biases) is wrapped by the
engine; the schedule (WarmupDecayLR) comes from the config and is stepped by the engine.
The token embedding is frozen (pretrained-style) and left out of the optimizer.
"""
import hashlib
import os
from types import SimpleNamespace

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
import deepspeed
from deepspeed.utils import safe_get_full_fp32_param

cfg = SimpleNamespace(vocab=120, dim=40, seq=12, micro=4, global_batch=32, steps=9,
                      lr=2e-3, clip=1.0, seed=21)

ds_config = {
    "train_batch_size": cfg.global_batch,
    "train_micro_batch_size_per_gpu": cfg.micro,
    "gradient_clipping": cfg.clip,
    "steps_per_print": 10_000,
    "zero_optimization": {"stage": 2, "contiguous_gradients": True, "overlap_comm": False,
                          "reduce_bucket_size": 2000},
    "scheduler": {"type": "WarmupDecayLR",
                  "params": {"warmup_min_lr": 0.0, "warmup_max_lr": cfg.lr,
                             "warmup_num_steps": 2, "total_num_steps": cfg.steps}},
    "zero_allow_untested_optimizer": True,
}


class Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(cfg.vocab, cfg.dim)
        self.emb.weight.requires_grad_(False)
        self.norm1 = nn.LayerNorm(cfg.dim)
        self.ff = nn.Linear(cfg.dim, cfg.dim)
        self.norm2 = nn.LayerNorm(cfg.dim)
        self.score = nn.Linear(cfg.dim, 1)

    def forward(self, ids):
        h = self.emb(ids)
        h = h + torch.tanh(self.ff(self.norm1(h)))
        return self.score(self.norm2(h).max(1).values).squeeze(-1)


def param_groups(model):
    decay, no_decay = [], []
    for n, p in model.named_parameters():
        if not p.requires_grad:
            continue
        (no_decay if n.endswith("bias") or "norm" in n else decay).append(p)
    return [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}]


def main():
    deepspeed.init_distributed(dist_backend="gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(cfg.seed)
    model = Encoder()
    opt = torch.optim.AdamW(param_groups(model), lr=cfg.lr, betas=(0.9, 0.98))
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, config=ds_config)
    ga = engine.gradient_accumulation_steps()
    assert ga == 4, ga

    g = torch.Generator().manual_seed(8)
    n = cfg.steps * cfg.global_batch
    ids = torch.randint(0, cfg.vocab, (n, cfg.seq), generator=g)
    target = ((ids < 30).float().mean(1) * 4 - (ids > 90).float().mean(1) * 3)
    ids, target = ids[rank::world], target[rank::world]

    engine.train()
    for x, y in zip(ids.split(cfg.micro), target.split(cfg.micro)):
        loss = F.smooth_l1_loss(engine(x), y)
        engine.backward(loss)
        engine.step()
    assert engine.global_steps == cfg.steps, engine.global_steps

    full = {}
    for name, p in engine.module.named_parameters():
        hp = safe_get_full_fp32_param(p) if p.requires_grad else None
        full[name] = (hp if hp is not None else p).detach().float().cpu().contiguous()
    h = hashlib.sha256()
    for t in full.values():
        h.update(t.numpy().tobytes())
    if rank == 0:
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
        if os.environ.get("PARAM_DUMP"):
            torch.save(full, os.environ["PARAM_DUMP"])


if __name__ == "__main__":
    main()
