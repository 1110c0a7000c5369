"""minGPT-style character model, trained on 2 DDP ranks with gradient accumulation.

Trainer/TrainerConfig follow karpathy/minGPT's original trainer: the learning rate
is decayed by the number of tokens processed (linear warm-up, then cosine).
Launch: torchrun --nproc-per-node 2 c_b01.py
"""
import hashlib
import math
import os
from contextlib import nullcontext
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, DistributedSampler


# ----------------------------------------------------------------------------- data
class PatternDataset(Dataset):
    """Sequences produced by a noisy affine recurrence mod vocab_size."""

    def __init__(self, n, block_size, vocab_size, seed=0):
        g = torch.Generator().manual_seed(seed)
        x = torch.empty(n, block_size + 1, dtype=torch.long)
        x[:, 0] = torch.randint(0, vocab_size, (n,), generator=g)
        for t in range(1, block_size + 1):
            noise = (torch.rand(n, generator=g) < 0.15).long() * torch.randint(0, vocab_size, (n,), generator=g)
            x[:, t] = (3 * x[:, t - 1] + 1 + noise) % vocab_size
        self.data = x
        self.block_size = block_size

    def __len__(self):
        return self.data.size(0)

    def __getitem__(self, i):
        chunk = self.data[i]
        return chunk[:-1], chunk[1:]


# ----------------------------------------------------------------------------- model
@dataclass
class GPTConfig:
    vocab_size: int = 32
    block_size: int = 16
    n_layer: int = 2
    n_head: int = 2
    n_embd: int = 32


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.key = nn.Linear(cfg.n_embd, cfg.n_embd)
        self.query = nn.Linear(cfg.n_embd, cfg.n_embd)
        self.value = nn.Linear(cfg.n_embd, cfg.n_embd)
        self.proj = nn.Linear(cfg.n_embd, cfg.n_embd)
        self.n_head = cfg.n_head
        self.register_buffer("mask", torch.tril(torch.ones(cfg.block_size, cfg.block_size)).view(1, 1, cfg.block_size, cfg.block_size))

    def forward(self, x):
        B, T, C = x.size()
        k = self.key(x).view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        q = self.query(x).view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = self.value(x).view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.mask[:, :, :T, :T] == 0, float("-inf"))
        att = F.softmax(att, dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        return self.proj(y)


class Block(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.n_embd)
        self.ln2 = nn.LayerNorm(cfg.n_embd)
        self.attn = CausalSelfAttention(cfg)
        self.mlp = nn.Sequential(nn.Linear(cfg.n_embd, 4 * cfg.n_embd), nn.GELU(), nn.Linear(4 * cfg.n_embd, cfg.n_embd))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.pos_emb = nn.Parameter(torch.zeros(1, cfg.block_size, cfg.n_embd))
        self.blocks = nn.Sequential(*[Block(cfg) for _ in range(cfg.n_layer)])
        self.ln_f = nn.LayerNorm(cfg.n_embd)
        self.head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(m):
        if isinstance(m, (nn.Linear, nn.Embedding)):
            m.weight.data.normal_(mean=0.0, std=0.02)
            if isinstance(m, nn.Linear) and m.bias is not None:
                m.bias.data.zero_()

    def forward(self, idx, targets=None):
        x = self.tok_emb(idx) + self.pos_emb[:, : idx.size(1)]
        logits = self.head(self.ln_f(self.blocks(x)))
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)
        return logits, loss


# ----------------------------------------------------------------------------- trainer
@dataclass
class TrainerConfig:
    max_epochs: int = 3
    batch_size: int = 4          # per rank, per micro-batch
    grad_accum_steps: int = 4
    learning_rate: float = 3e-3
    betas: tuple = (0.9, 0.95)
    grad_norm_clip: float = 1.0
    weight_decay: float = 0.1
    lr_decay: bool = True
    warmup_tokens: int = 512
    final_tokens: int = 0        # filled in from the dataset: tokens of the whole run


class Trainer:
    def __init__(self, model, train_dataset, config, rank, world_size):
        self.config = config
        self.rank, self.world_size = rank, world_size
        self.raw_model = model
        self.model = DDP(model)
        self.train_dataset = train_dataset
        self.tokens = 0
        decay, no_decay = [], []
        for n, p in model.named_parameters():
            (decay if p.dim() >= 2 and "emb" not in n else no_decay).append(p)
        self.optimizer = torch.optim.AdamW(
            [{"params": decay, "weight_decay": config.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
            lr=config.learning_rate, betas=config.betas,
        )

    def _lr(self):
        cfg = self.config
        if not cfg.lr_decay:
            return cfg.learning_rate
        if self.tokens < cfg.warmup_tokens:
            lr_mult = float(self.tokens) / float(max(1, cfg.warmup_tokens))
        else:
            progress = float(self.tokens - cfg.warmup_tokens) / float(max(1, cfg.final_tokens - cfg.warmup_tokens))
            lr_mult = max(0.1, 0.5 * (1.0 + math.cos(math.pi * min(progress, 1.0))))
        return cfg.learning_rate * lr_mult

    def run_epoch(self, epoch):
        cfg, K = self.config, self.config.grad_accum_steps
        sampler = DistributedSampler(self.train_dataset, num_replicas=self.world_size, rank=self.rank, shuffle=True, seed=1234)
        sampler.set_epoch(epoch)
        loader = DataLoader(self.train_dataset, batch_size=cfg.batch_size, sampler=sampler, drop_last=True)
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        for it, (x, y) in enumerate(loader):
            boundary = (it + 1) % K == 0
            ctx = nullcontext() if boundary else self.model.no_sync()
            with ctx:
                _, loss = self.model(x, y)
                (loss / K).backward()
            # number of tokens processed, for the learning-rate decay
            n_tok = (y >= 0).sum()
            dist.all_reduce(n_tok)  # tokens of all ranks
            self.tokens += n_tok.item()
            if boundary:
                torch.nn.utils.clip_grad_norm_(self.raw_model.parameters(), cfg.grad_norm_clip)
                lr = self._lr()
                for group in self.optimizer.param_groups:
                    group["lr"] = lr
                self.optimizer.step()
                self.optimizer.zero_grad(set_to_none=True)

    def train(self):
        for epoch in range(self.config.max_epochs):
            self.run_epoch(epoch)


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    mcfg = GPTConfig()
    ds = PatternDataset(128, mcfg.block_size, mcfg.vocab_size, seed=0)
    tcfg = TrainerConfig()
    tcfg.final_tokens = tcfg.max_epochs * len(ds) * mcfg.block_size
    model = GPT(mcfg)
    Trainer(model, ds, tcfg, rank, world).train()
    if rank == 0:
        flat = torch.cat([p.detach().float().reshape(-1) for _, p in model.named_parameters()])
        print("FINAL_SHA256", hashlib.sha256(flat.numpy().tobytes()).hexdigest())
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
