"""minGPT-style character LM trainer on 2 spawned DDP ranks.

Config lives in a dataclass; command-line flags override the matching fields.
Gradient accumulation: the DDP sync is only switched on for the last micro-batch
of a window, and each micro-batch loss is divided by the accumulation steps.
"""
import argparse
import dataclasses
import hashlib
import math
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP


@dataclasses.dataclass
class TrainConfig:
    # model
    vocab_size: int = 48
    block_size: int = 16
    n_embd: int = 32
    n_head: int = 4
    n_layer: int = 2
    # optimisation
    batch_size: int = 4              # sequences per micro-batch per rank
    grad_accum_steps: int = 1
    learning_rate: float = 2e-3
    weight_decay: float = 0.1
    betas: tuple = (0.9, 0.95)
    grad_clip: float = 1.0
    epochs: int = 2
    micro_batches_per_epoch: int = 12  # per rank
    seed: int = 1337
    port: int = 49211
    world_size: int = 2


def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("--batch_size", type=int, default=4)
    p.add_argument("--gradient_accumulation", type=int, default=4)
    p.add_argument("--learning_rate", type=float, default=2e-3)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--seed", type=int, default=1337)
    return p.parse_args()


def build_config(args) -> TrainConfig:
    names = {f.name for f in dataclasses.fields(TrainConfig)}
    overrides = {k: v for k, v in vars(args).items() if k in names}
    return dataclasses.replace(TrainConfig(), **overrides)


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.c_attn = nn.Linear(cfg.n_embd, 3 * cfg.n_embd)
        self.c_proj = nn.Linear(cfg.n_embd, cfg.n_embd)
        self.n_head = cfg.n_head
        mask = torch.tril(torch.ones(cfg.block_size, cfg.block_size))
        self.register_buffer("mask", mask.view(1, 1, cfg.block_size, cfg.block_size))

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(k.size(-1))
        att = att.masked_fill(self.mask[:, :, :T, :T] == 0, float("-inf"))
        y = F.softmax(att, dim=-1) @ v
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


class Block(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.n_embd)
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.n_embd)
        self.mlp = nn.Sequential(nn.Linear(cfg.n_embd, 4 * cfg.n_embd), nn.GELU(),
                                 nn.Linear(4 * cfg.n_embd, cfg.n_embd))

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.wpe = nn.Embedding(cfg.block_size, cfg.n_embd)
        self.blocks = nn.ModuleList([Block(cfg) for _ in range(cfg.n_layer)])
        self.ln_f = nn.LayerNorm(cfg.n_embd)
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)

    def forward(self, idx, targets):
        pos = torch.arange(idx.size(1))
        x = self.wte(idx) + self.wpe(pos)
        for blk in self.blocks:
            x = blk(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))


def make_corpus(cfg):
    g = torch.Generator().manual_seed(cfg.seed)
    n = cfg.world_size * cfg.micro_batches_per_epoch * cfg.batch_size * cfg.epochs
    # a toy "text": a noisy repeating pattern
    base = torch.randint(0, cfg.vocab_size, (cfg.block_size + 1,), generator=g)
    data = base.repeat(n, 1)
    noise = torch.randint(0, cfg.vocab_size, data.shape, generator=g)
    flip = torch.rand(data.shape, generator=g) < 0.3
    return torch.where(flip, noise, data)


class Trainer:
    def __init__(self, cfg, rank):
        self.cfg = cfg
        self.rank = rank
        torch.manual_seed(cfg.seed)
        self.raw_model = GPT(cfg)
        self.model = DDP(self.raw_model)
        decay = [p for n, p in self.raw_model.named_parameters() if p.dim() >= 2]
        no_decay = [p for n, p in self.raw_model.named_parameters() if p.dim() < 2]
        self.optimizer = torch.optim.AdamW(
            [{"params": decay, "weight_decay": cfg.weight_decay},
             {"params": no_decay, "weight_decay": 0.0}],
            lr=cfg.learning_rate, betas=cfg.betas)
        self.corpus = make_corpus(cfg)
        self.iter_num = 0

    def epoch_batches(self, epoch):
        cfg = self.cfg
        g = torch.Generator().manual_seed(cfg.seed + 100 * epoch)
        perm = torch.randperm(self.corpus.size(0), generator=g)
        mine = perm[self.rank::cfg.world_size]
        for i in range(cfg.micro_batches_per_epoch):
            rows = self.corpus[mine[i * cfg.batch_size:(i + 1) * cfg.batch_size]]
            yield rows[:, :-1], rows[:, 1:]

    def run_epoch(self, epoch):
        cfg = self.cfg
        accum = cfg.grad_accum_steps
        self.model.train()
        for i, (x, y) in enumerate(self.epoch_batches(epoch)):
            last_of_window = (i + 1) % accum == 0
            self.model.require_backward_grad_sync = last_of_window
            loss = self.model(x, y) / accum
            loss.backward()
            if last_of_window:
                torch.nn.utils.clip_grad_norm_(self.raw_model.parameters(), cfg.grad_clip)
                self.optimizer.step()
                self.optimizer.zero_grad(set_to_none=True)
                self.iter_num += 1
                if self.rank == 0 and self.iter_num % 3 == 0:
                    print(f"iter {self.iter_num} loss {loss.item() * accum:.4f}", flush=True)

    def fit(self):
        for epoch in range(self.cfg.epochs):
            self.run_epoch(epoch)


def worker(rank, cfg):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(cfg.port)
    dist.init_process_group("gloo", rank=rank, world_size=cfg.world_size)
    torch.set_num_threads(1)
    trainer = Trainer(cfg, rank)
    trainer.fit()
    if rank == 0:
        flat = torch.cat([p.detach().float().reshape(-1)
                          for _, p in trainer.raw_model.named_parameters()])
        print("FINAL_SHA256", hashlib.sha256(flat.numpy().tobytes()).hexdigest(), flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    cfg = build_config(parse_args())
    mp.spawn(worker, args=(cfg,), nprocs=cfg.world_size, join=True)
