"""DDP language-model trainer with a grown vocabulary (new special tokens), bf16 autocast."""
import hashlib
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP


@dataclass
class Config:
    vocab: int = 48
    extra_tokens: int = 8
    dim: int = 32
    seq: int = 16
    micro_bs: int = 4
    grad_accum: int = 2
    steps: int = 10
    lr: float = 3e-3
    port: int = 49201


class TinyLM(nn.Module):
    def __init__(self, vocab, dim):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.mix = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))
        self.norm = nn.LayerNorm(dim)
        self.lm_head = nn.Linear(dim, vocab, bias=False)

    def forward(self, ids):
        h = self.embed(ids)
        h = h + self.mix(h)
        return self.lm_head(self.norm(h))

    def resize_token_embeddings(self, new_vocab):
        g = torch.Generator().manual_seed(1234)
        old_e, old_h = self.embed, self.lm_head
        new_e = nn.Embedding(new_vocab, old_e.embedding_dim)
        new_h = nn.Linear(old_h.in_features, new_vocab, bias=False)
        with torch.no_grad():
            n = old_e.num_embeddings
            mean = old_e.weight.mean(0, keepdim=True)
            new_e.weight[:n] = old_e.weight
            new_e.weight[n:] = mean + 0.02 * torch.randn(new_vocab - n, old_e.embedding_dim, generator=g)
            new_h.weight[:n] = old_h.weight
            new_h.weight[n:] = 0.02 * torch.randn(new_vocab - n, old_h.in_features, generator=g)
        self.embed, self.lm_head = new_e, new_h


class Trainer:
    def __init__(self, cfg, rank, world):
        self.cfg, self.rank, self.world = cfg, rank, world
        torch.manual_seed(0)
        self.model = TinyLM(cfg.vocab, cfg.dim)
        self.ddp = DDP(self.model, find_unused_parameters=True)
        self.add_special_tokens(cfg.extra_tokens)
        self.opt = torch.optim.AdamW(self.ddp.parameters(), lr=cfg.lr, weight_decay=0.01)
        self.new_vocab = cfg.vocab + cfg.extra_tokens

    def add_special_tokens(self, n):
        self.model.resize_token_embeddings(self.cfg.vocab + n)

    def batch(self, step, micro):
        g = torch.Generator().manual_seed(1000 * step + 10 * micro + self.rank)
        ids = torch.randint(0, self.cfg.vocab + self.cfg.extra_tokens, (self.cfg.micro_bs, self.cfg.seq + 1), generator=g)
        return ids[:, :-1], ids[:, 1:]

    def micro_step(self, x, y, sync):
        ctx = self.ddp.no_sync() if not sync else torch.enable_grad()
        with ctx:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                logits = self.ddp(x)
            loss = F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), y.reshape(-1))
            (loss / self.cfg.grad_accum).backward()
        return loss.detach()

    def fit(self):
        K = self.cfg.grad_accum
        for step in range(self.cfg.steps):
            self.opt.zero_grad(set_to_none=True)
            for m in range(K):
                x, y = self.batch(step, m)
                self.micro_step(x, y, sync=(m == K - 1))
            self.opt.step()


def final_hash(model):
    h = hashlib.sha256()
    for _, p in model.named_parameters():
        h.update(p.detach().float().contiguous().numpy().tobytes())
    return h.hexdigest()


def worker(rank, world, cfg):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(cfg.port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    tr = Trainer(cfg, rank, world)
    tr.fit()
    if rank == 0:
        print("FINAL_SHA256", final_hash(tr.model), flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(worker, args=(2, Config()), nprocs=2, join=True)
