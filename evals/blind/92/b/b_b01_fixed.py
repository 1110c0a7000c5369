"""Pre-training a tiny causal LM with a DeepSpeed ZeRO-1 engine in bf16.

The engine owns the accumulation (gradient_accumulation_steps in the config) and the loop
is the usual engine.backward / engine.step pair on every micro-batch.
"""
import argparse
import hashlib
import os
from dataclasses import dataclass

import deepspeed
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class RunConfig:
    vocab: int = 97
    d_model: int = 64
    seq_len: int = 16
    micro_batch: int = 4
    grad_accum: int = 16
    steps: int = 12
    lr: float = 3e-3
    seed: int = 1234


def ds_config(cfg: RunConfig, world: int) -> dict:
    return {
        "train_micro_batch_size_per_gpu": cfg.micro_batch,
        "gradient_accumulation_steps": cfg.grad_accum,
        "train_batch_size": cfg.micro_batch * cfg.grad_accum * world,
        "gradient_clipping": 0.0,
        "bf16": {"enabled": True},
        # accumulate in fp32 (BF16_Optimizer), bf16 sums over 16 micro-batches lose bits
        "data_types": {"grad_accum_dtype": "fp32"},
        "zero_optimization": {"stage": 1},
        "steps_per_print": 10_000,
        "wall_clock_breakdown": False,
    }


class TinyLM(nn.Module):
    def __init__(self, cfg: RunConfig):
        super().__init__()
        self.tok = nn.Embedding(cfg.vocab, cfg.d_model)
        self.pos = nn.Parameter(torch.randn(cfg.seq_len, cfg.d_model) * 0.02)
        self.mix = nn.Sequential(nn.LayerNorm(cfg.d_model), nn.Linear(cfg.d_model, 4 * cfg.d_model), nn.GELU(),
                                 nn.Linear(4 * cfg.d_model, cfg.d_model))
        self.norm = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab, bias=False)

    def forward(self, idx):
        h = self.tok(idx) + self.pos[: idx.shape[1]]
        h = h + self.mix(h)
        return self.head(self.norm(h))


def make_batches(cfg: RunConfig, rank: int, n: int):
    g = torch.Generator().manual_seed(cfg.seed + 17 * rank)
    out = []
    for _ in range(n):
        x = torch.randint(0, cfg.vocab, (cfg.micro_batch, cfg.seq_len + 1), generator=g)
        out.append((x[:, :-1], x[:, 1:]))
    return out


def params_sha(module: nn.Module) -> str:
    h = hashlib.sha256()
    for _, p in module.named_parameters():
        h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--local_rank", type=int, default=int(os.environ.get("LOCAL_RANK", 0)))
    parser.parse_args()
    cfg = RunConfig()
    deepspeed.init_distributed(dist_backend="gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(cfg.seed)

    model = TinyLM(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.01)
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, config=ds_config(cfg, world))

    batches = make_batches(cfg, rank, cfg.steps * cfg.grad_accum)
    for x, y in batches:
        logits = engine(x)
        loss = F.cross_entropy(logits.float().reshape(-1, cfg.vocab), y.reshape(-1))
        engine.backward(loss)
        engine.step()

    assert engine.global_steps == cfg.steps
    if rank == 0:
        print("FINAL_SHA256", params_sha(engine.module), flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
