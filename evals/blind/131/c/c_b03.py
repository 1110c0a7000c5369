"""nanoGPT-style training, refactored into a Trainer class.

The model is built at its "pretrained" context length and cropped to the context
length of this run, as nanoGPT does with `crop_block_size`.
"""
import hashlib
import math
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP


@dataclass
class GPTConfig:
    block_size: int = 64
    vocab_size: int = 96
    n_layer: int = 2
    n_head: int = 2
    n_embd: int = 48
    dropout: float = 0.0
    bias: bool = False


@dataclass
class TrainConfig:
    block_size: int = 24          # context used for this run (<= GPTConfig.block_size)
    batch_size: int = 4
    gradient_accumulation_steps: int = 4
    max_iters: int = 20
    learning_rate: float = 3e-3
    min_lr: float = 3e-4
    warmup_iters: int = 4
    lr_decay_iters: int = 20
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0
    ddp_find_unused_parameters: bool = True
    seed: int = 1337


class CausalSelfAttention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c_attn = nn.Linear(c.n_embd, 3 * c.n_embd, bias=c.bias)
        self.c_proj = nn.Linear(c.n_embd, c.n_embd, bias=c.bias)
        self.n_head = c.n_head

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.ln_1 = nn.LayerNorm(c.n_embd, bias=c.bias)
        self.attn = CausalSelfAttention(c)
        self.ln_2 = nn.LayerNorm(c.n_embd, bias=c.bias)
        self.mlp = nn.Sequential(nn.Linear(c.n_embd, 4 * c.n_embd, bias=c.bias), nn.GELU(),
                                 nn.Linear(4 * c.n_embd, c.n_embd, bias=c.bias))

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.vocab_size, config.n_embd),
            wpe=nn.Embedding(config.block_size, config.n_embd),
            h=nn.ModuleList([Block(config) for _ in range(config.n_layer)]),
            ln_f=nn.LayerNorm(config.n_embd, bias=config.bias),
        ))
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(m):
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)
            if getattr(m, "bias", None) is not None:
                nn.init.zeros_(m.bias)

    def forward(self, idx, targets=None):
        b, t = idx.size()
        pos = torch.arange(0, t, dtype=torch.long, device=idx.device)
        x = self.transformer.wte(idx) + self.transformer.wpe(pos)
        for block in self.transformer.h:
            x = block(x)
        logits = self.lm_head(self.transformer.ln_f(x))
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)
        return logits, loss

    def crop_block_size(self, block_size):
        # model surgery to decrease the block size if necessary
        assert block_size <= self.config.block_size
        self.config.block_size = block_size
        self.transformer.wpe.weight = nn.Parameter(self.transformer.wpe.weight[:block_size])

    def configure_optimizers(self, weight_decay, learning_rate, betas):
        params = {n: p for n, p in self.named_parameters() if p.requires_grad}
        decay = [p for p in params.values() if p.dim() >= 2]
        nodecay = [p for p in params.values() if p.dim() < 2]
        groups = [{"params": decay, "weight_decay": weight_decay},
                  {"params": nodecay, "weight_decay": 0.0}]
        return torch.optim.AdamW(groups, lr=learning_rate, betas=betas)


class Trainer:
    def __init__(self, model_cfg: GPTConfig, cfg: TrainConfig):
        self.cfg = cfg
        dist.init_process_group("gloo")
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        torch.manual_seed(cfg.seed)
        self.raw_model = GPT(model_cfg)      # "pretrained" weights, same on every rank
        self.model = DDP(self.raw_model, find_unused_parameters=cfg.ddp_find_unused_parameters)
        self.optimizer = None

    def setup(self):
        if self.cfg.block_size < self.raw_model.config.block_size:
            self.raw_model.crop_block_size(self.cfg.block_size)
        c = self.cfg
        self.optimizer = self.raw_model.configure_optimizers(c.weight_decay, c.learning_rate, (c.beta1, c.beta2))

    def get_batch(self, it, micro_step):
        # synthetic token stream: a noisy copy task, different data per rank / step
        g = torch.Generator().manual_seed(10_000 * self.rank + 100 * it + micro_step)
        V, T = self.raw_model.config.vocab_size, self.cfg.block_size
        base = torch.randint(0, V, (self.cfg.batch_size, T + 1), generator=g)
        base[:, 1::2] = (base[:, 0:-1:2] * 7 + 3) % V
        return base[:, :-1].contiguous(), base[:, 1:].contiguous()

    def get_lr(self, it):
        c = self.cfg
        if it < c.warmup_iters:
            return c.learning_rate * (it + 1) / (c.warmup_iters + 1)
        if it > c.lr_decay_iters:
            return c.min_lr
        ratio = (it - c.warmup_iters) / (c.lr_decay_iters - c.warmup_iters)
        return c.min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (c.learning_rate - c.min_lr)

    def fit(self):
        self.setup()
        c, K = self.cfg, self.cfg.gradient_accumulation_steps
        for it in range(c.max_iters):
            lr = self.get_lr(it)
            for group in self.optimizer.param_groups:
                group["lr"] = lr
            for micro_step in range(K):
                self.model.require_backward_grad_sync = (micro_step == K - 1)
                X, Y = self.get_batch(it, micro_step)
                _, loss = self.model(X, Y)
                (loss / K).backward()
            if c.grad_clip != 0.0:
                torch.nn.utils.clip_grad_norm_(self.raw_model.parameters(), c.grad_clip)
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
            if self.rank == 0 and it % 5 == 0:
                print(f"iter {it}: loss {loss.item():.4f} lr {lr:.2e}", flush=True)

    def final_digest(self):
        h = hashlib.sha256()
        for _, p in self.raw_model.named_parameters():
            h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
        return h.hexdigest()


def main():
    torch.set_num_threads(1)
    trainer = Trainer(GPTConfig(), TrainConfig())
    trainer.fit()
    if trainer.rank == 0:
        print(f"FINAL_SHA256 {trainer.final_digest()}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
