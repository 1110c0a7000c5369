"""Token-budgeted LM training on a DeepSpeed ZeRO-0 engine (plain data parallel).

The learning rate follows a GPT-3 style token schedule: linear warm-up over the first
`warmup_frac` of the token budget, cosine decay to `min_lr` at the end of the budget.
DeepSpeed does the accumulation (gradient_accumulation_steps in the config); the trainer
writes the rate into the optimizer itself.
"""
import hashlib
import math
from dataclasses import dataclass, asdict

import deepspeed
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class TrainConfig:
    vocab: int = 96
    seq_len: int = 24
    d_model: int = 48
    micro_bs: int = 4
    grad_accum: int = 4
    max_steps: int = 24
    max_lr: float = 4e-3
    min_lr: float = 4e-4
    warmup_frac: float = 0.1
    weight_decay: float = 0.05
    seed: int = 1234


class GatedMLP(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.gate = nn.Linear(d, 2 * d, bias=False)
        self.up = nn.Linear(d, 2 * d, bias=False)
        self.down = nn.Linear(2 * d, d, bias=False)

    def forward(self, x):
        h = self.norm(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class CausalConvLM(nn.Module):
    """Token mixing by a causal depthwise conv, channel mixing by gated MLPs."""

    def __init__(self, cfg):
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab, cfg.d_model)
        self.mix = nn.Conv1d(cfg.d_model, cfg.d_model, kernel_size=3, groups=cfg.d_model, padding=2)
        self.layers = nn.ModuleList([GatedMLP(cfg.d_model) for _ in range(2)])
        self.out = nn.Linear(cfg.d_model, cfg.vocab)

    def forward(self, idx):
        x = self.embed(idx)
        x = x + self.mix(x.transpose(1, 2))[..., : idx.size(1)].transpose(1, 2)
        for layer in self.layers:
            x = layer(x)
        return self.out(x)


class TokenDataset:
    def __init__(self, cfg, rank):
        self.cfg, self.rank = cfg, rank

    def batch(self, n):
        g = torch.Generator().manual_seed(self.cfg.seed + 7919 * n + 31 * self.rank)
        x = torch.randint(0, self.cfg.vocab, (self.cfg.micro_bs, self.cfg.seq_len + 1), generator=g)
        x[:, 2::2] = (x[:, 1:-1:2] + x[:, 0:-2:2]) % self.cfg.vocab
        return x[:, :-1], x[:, 1:]


class Trainer:
    def __init__(self, cfg):
        self.cfg = cfg
        deepspeed.init_distributed(dist_backend="gloo")
        self.world, self.rank = dist.get_world_size(), dist.get_rank()
        torch.manual_seed(cfg.seed)
        model = CausalConvLM(cfg)
        decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
        no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
        opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                                 {"params": no_decay, "weight_decay": 0.0}], lr=cfg.max_lr)
        ds_config = {
            "train_micro_batch_size_per_gpu": cfg.micro_bs,
            "gradient_accumulation_steps": cfg.grad_accum,
            "gradient_clipping": 0.0,
            "zero_optimization": {"stage": 0},
            "steps_per_print": 10**6,
        }
        self.engine, self.optimizer, _, _ = deepspeed.initialize(model=model, optimizer=opt, config=ds_config)
        self.data = TokenDataset(cfg, self.rank)
        # token budget of the run
        tokens_per_step = cfg.micro_bs * cfg.seq_len * self.world
        self.total_tokens = cfg.max_steps * tokens_per_step
        self.warmup_tokens = int(cfg.warmup_frac * self.total_tokens)

    def lr_at(self, tokens):
        c = self.cfg
        if tokens < self.warmup_tokens:
            return c.max_lr * (tokens + 1) / self.warmup_tokens
        progress = min(1.0, (tokens - self.warmup_tokens) / max(1, self.total_tokens - self.warmup_tokens))
        return c.min_lr + 0.5 * (c.max_lr - c.min_lr) * (1 + math.cos(math.pi * progress))

    def micro_step(self, n):
        tokens_seen = self.engine.global_samples * self.cfg.seq_len
        lr = self.lr_at(tokens_seen)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        idx, tgt = self.data.batch(n)
        logits = self.engine(idx)
        loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), tgt.reshape(-1))
        self.engine.backward(loss)
        self.engine.step()
        return loss.item(), lr

    def fit(self):
        n = 0
        while self.engine.global_steps < self.cfg.max_steps:
            loss, lr = self.micro_step(n)
            n += 1
            if self.rank == 0 and n % (4 * self.cfg.grad_accum) == 0:
                print(f"step {self.engine.global_steps} loss {loss:.4f} lr {lr:.2e}", flush=True)

    def final_hash(self, dump=None):
        h = hashlib.sha256()
        for _, p in self.engine.module.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        if self.rank == 0:
            print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
            if dump:
                torch.save({k: v.detach().clone() for k, v in self.engine.module.named_parameters()}, dump)


if __name__ == "__main__":
    import argparse
    ap = argparse.ArgumentParser()
    ap.add_argument("--local_rank", type=int, default=-1)
    ap.add_argument("--dump", default=None)
    a = ap.parse_args()
    t = Trainer(TrainConfig())
    t.fit()
    t.final_hash(a.dump)
    dist.barrier()
