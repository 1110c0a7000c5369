# corpus: style=nanogpt class=OK
# the schedule is given in tokens; max_iters and the warmup both divide by the tokens of
# an iteration (K micro-batches)
import math

import torch

config = dict(batch_size=8, block_size=256, grad_accum=8, max_tokens=50_000_000,
              warmup_tokens=2_000_000, lr=6e-4, min_lr=6e-5)


def cosine(it, warmup, total, cfg):
    if it < warmup:
        return cfg["lr"] * (it + 1) / warmup
    ratio = min(1.0, (it - warmup) / max(1, total - warmup))
    return cfg["min_lr"] + 0.5 * (1 + math.cos(math.pi * ratio)) * (cfg["lr"] - cfg["min_lr"])


def main(model, get_batch, cfg=config):
    accum = cfg["grad_accum"]
    tokens_per_iter = accum * cfg["batch_size"] * cfg["block_size"]
    max_iters = cfg["max_tokens"] // tokens_per_iter
    warmup_iters = cfg["warmup_tokens"] // tokens_per_iter
    opt = torch.optim.AdamW(model.parameters(), lr=cfg["lr"])
    for it in range(max_iters):
        for g in opt.param_groups:
            g["lr"] = cosine(it, warmup_iters, max_iters, cfg)
        for _ in range(accum):
            x, y = get_batch()
            (model(x, y) / accum).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
