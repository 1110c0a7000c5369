"""Text classifier on a DeepSpeed ZeRO-1 engine with bf16 compute.

Settings live in a dataclass; command-line flags override them.  The engine
config is rendered from the settings by `to_ds_config`.
"""
import argparse, hashlib
from dataclasses import dataclass, replace

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.distributed as dist
import deepspeed


@dataclass
class Settings:
    micro_batch: int = 8
    grad_accum: int = 1
    steps: int = 8
    lr: float = 0.05
    clip: float = 0.0
    n_classes: int = 5


def to_ds_config(s: Settings, world: int) -> dict:
    return {
        "train_micro_batch_size_per_gpu": s.micro_batch,
        "gradient_accumulation_steps": s.grad_accum,
        "train_batch_size": s.micro_batch * s.grad_accum * world,
        "gradient_clipping": s.clip,
        "bf16": {"enabled": True},
        "data_types": {"grad_accum_dtype": "fp32"},
        "zero_optimization": {"stage": 1},
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 10_000,
    }


DEFAULTS = Settings()


class BagClassifier(nn.Module):
    def __init__(self, vocab=200, d=32, n_classes=5):
        super().__init__()
        self.emb = nn.EmbeddingBag(vocab, d, mode="mean")
        self.mlp = nn.Sequential(nn.Linear(d, d), nn.Tanh(), nn.Linear(d, n_classes))

    def forward(self, tokens):
        return self.mlp(self.emb(tokens))


def parse():
    ap = argparse.ArgumentParser()
    ap.add_argument("--grad-accum", type=int, default=4)
    ap.add_argument("--steps", type=int, default=DEFAULTS.steps)
    ap.add_argument("--lr", type=float, default=DEFAULTS.lr)
    a = ap.parse_args()
    return replace(DEFAULTS, grad_accum=a.grad_accum, steps=a.steps, lr=a.lr)


def synthetic(s: Settings, rank: int):
    g = torch.Generator().manual_seed(7 + rank)
    n = s.steps * s.grad_accum
    toks = torch.randint(0, 200, (n, s.micro_batch, 12), generator=g)
    labels = (toks[..., :3].sum(-1) % s.n_classes)
    return toks, labels


def main():
    s = parse()
    deepspeed.init_distributed(dist_backend="gloo")
    rank, world = dist.get_rank(), dist.get_world_size()

    torch.manual_seed(0)
    model = BagClassifier(n_classes=s.n_classes)
    opt = torch.optim.SGD(model.parameters(), lr=s.lr, momentum=0.9)
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt,
                                           config=to_ds_config(DEFAULTS, world))

    toks, labels = synthetic(s, rank)
    for step in range(s.steps):
        for k in range(s.grad_accum):
            i = step * s.grad_accum + k
            logits = engine(toks[i])
            loss = F.cross_entropy(logits.float(), labels[i])
            engine.backward(loss)
            engine.step()

    h = hashlib.sha256()
    for _, p in engine.module.named_parameters():
        t = p.detach().float().contiguous()
        h.update(t.numpy().tobytes())
    if rank == 0:
        print("FINAL_SHA256", h.hexdigest(), flush=True)
    dist.barrier()


if __name__ == "__main__":
    main()
