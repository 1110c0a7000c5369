"""Small causal LM trained with FSDP2 (fully_shard) from a trainer class, CPU/gloo.

K micro-batches per optimizer step; gradient reduce-scatter deferred to the last
micro-batch of each window; cosine LR with linear warm-up, stepped once per update.
"""
import hashlib
import math
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


@dataclass
class Config:
    vocab: int = 64
    d_model: int = 32
    n_layers: int = 2
    seq_len: int = 16
    num_samples: int = 240        # dataset size (sequences)
    micro_batch: int = 4          # per device
    grad_accum: int = 3
    epochs: int = 2
    lr: float = 3e-3
    min_lr_ratio: float = 0.05
    warmup_steps: int = 2
    seed: int = 2024


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.ln1 = nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, 4, batch_first=True)
        self.ln2 = nn.LayerNorm(d)
        self.ff = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x, mask):
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.ff(self.ln2(x))


class TinyLM(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.tok = nn.Embedding(cfg.vocab, cfg.d_model)
        self.pos = nn.Embedding(cfg.seq_len, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg.d_model) for _ in range(cfg.n_layers))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab, bias=False)

    def forward(self, idx):
        T = idx.shape[1]
        mask = torch.triu(torch.full((T, T), float("-inf")), diagonal=1)
        x = self.tok(idx) + self.pos(torch.arange(T))
        for b in self.blocks:
            x = b(x, mask)
        return self.lm_head(self.ln_f(x))


def cosine_with_warmup(optimizer, warmup, total, min_ratio):
    def f(step):
        if step < warmup:
            return (step + 1) / warmup
        prog = min(1.0, (step - warmup) / max(1, total - warmup))
        return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * prog))
    return torch.optim.lr_scheduler.LambdaLR(optimizer, f)


class FSDPTrainer:
    def __init__(self, cfg: Config):
        self.cfg = cfg
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        torch.manual_seed(cfg.seed)
        model = TinyLM(cfg)
        for blk in model.blocks:
            fully_shard(blk)
        self.model = fully_shard(model)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=cfg.lr, weight_decay=0.1)

        g = torch.Generator().manual_seed(cfg.seed + 1)
        base = torch.randint(0, cfg.vocab, (cfg.num_samples, 1), generator=g)
        steps = torch.randint(1, 4, (cfg.num_samples, 1), generator=g)
        data = (base + steps * torch.arange(cfg.seq_len + 1)) % cfg.vocab
        ds = TensorDataset(data)
        self.sampler = DistributedSampler(ds, num_replicas=self.world, rank=self.rank,
                                          shuffle=True, seed=cfg.seed)
        self.loader = DataLoader(ds, batch_size=cfg.micro_batch, sampler=self.sampler)

        # optimizer updates over the whole run: samples / samples-per-update
        samples_per_update = cfg.micro_batch * cfg.grad_accum * self.world
        self.total_steps = math.ceil(cfg.num_samples / samples_per_update) * cfg.epochs
        self.scheduler = cosine_with_warmup(self.optimizer, cfg.warmup_steps,
                                            self.total_steps, cfg.min_lr_ratio)

    def _loss(self, batch):
        seq = batch[0]
        logits = self.model(seq[:, :-1])
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)), seq[:, 1:].reshape(-1))

    def _update(self):
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)

    def train(self):
        K = self.cfg.grad_accum
        n_updates = 0
        for epoch in range(self.cfg.epochs):
            self.sampler.set_epoch(epoch)
            for i, batch in enumerate(self.loader):
                boundary = (i + 1) % K == 0
                self.model.set_requires_gradient_sync(boundary)
                loss = self._loss(batch) / K
                loss.backward()
                if boundary:
                    self._update()
                    n_updates += 1
            if self.rank == 0:
                print(f"epoch {epoch} updates {n_updates} lr {self.scheduler.get_last_lr()[0]:.2e} "
                      f"(planned {self.total_steps})", flush=True)

    def params_sha256(self):
        h = hashlib.sha256()
        for _, p in self.model.named_parameters():
            t = p.full_tensor() if isinstance(p, DTensor) else p
            h.update(t.detach().float().contiguous().numpy().tobytes())
        return h.hexdigest()


def main():
    torch.use_deterministic_algorithms(True)
    dist.init_process_group("gloo")
    trainer = FSDPTrainer(Config())
    trainer.train()
    sha = trainer.params_sha256()
    if dist.get_rank() == 0:
        print(f"FINAL_SHA256 {sha}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
