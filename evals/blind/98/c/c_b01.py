"""minGPT-style char LM trainer, split into hooks, DDP over torchrun.

Synthetic "characters"; each rank sees 42 sequences per epoch -> 10 full batches
and one short batch of 2. The window loss is a token sum over the tokens of the
window (counted up front from the sampler), so short windows are handled too.
"""
import contextlib
import hashlib
import math
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler


@dataclass
class GPTConfig:
    vocab_size: int = 32
    block_size: int = 16
    n_layer: int = 2
    n_head: int = 2
    n_embd: int = 32


@dataclass
class TrainerConfig:
    max_epochs: int = 2
    batch_size: int = 4
    grad_accum: int = 3
    learning_rate: float = 3e-3
    betas: tuple = (0.9, 0.95)
    weight_decay: float = 0.1
    grad_norm_clip: float = 1.0
    seed: int = 1337


class CharDataset(Dataset):
    def __init__(self, n, block, vocab, seed=0):
        g = torch.Generator().manual_seed(seed)
        self.data = torch.randint(0, vocab, (n, block + 1), generator=g)

    def __len__(self):
        return len(self.data)

    def __getitem__(self, i):
        chunk = self.data[i]
        return chunk[:-1], chunk[1:]


class Block(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.n_embd)
        self.qkv = nn.Linear(cfg.n_embd, 3 * cfg.n_embd)
        self.proj = nn.Linear(cfg.n_embd, cfg.n_embd)
        self.ln2 = nn.LayerNorm(cfg.n_embd)
        self.mlp = nn.Sequential(nn.Linear(cfg.n_embd, 4 * cfg.n_embd), nn.GELU(),
                                 nn.Linear(4 * cfg.n_embd, cfg.n_embd))
        self.n_head = cfg.n_head

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(B, T, C))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.pos_emb = nn.Parameter(torch.zeros(1, cfg.block_size, cfg.n_embd))
        self.blocks = nn.ModuleList([Block(cfg) for _ in range(cfg.n_layer)])
        self.ln_f = nn.LayerNorm(cfg.n_embd)
        self.head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        nn.init.normal_(self.pos_emb, std=0.02)

    def forward(self, idx, targets):
        x = self.tok_emb(idx) + self.pos_emb[:, : idx.size(1)]
        for b in self.blocks:
            x = b(x)
        logits = self.head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), reduction="sum")


class Trainer:
    def __init__(self, model, dataset, config):
        self.config = config
        self.rank = dist.get_rank()
        self.raw_model = model
        self.model = DDP(model)
        self.sampler = DistributedSampler(dataset, shuffle=True, seed=config.seed)
        self.loader = DataLoader(dataset, batch_size=config.batch_size, sampler=self.sampler)
        decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
        no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
        self.optimizer = torch.optim.AdamW(
            [{"params": decay, "weight_decay": config.weight_decay},
             {"params": no_decay, "weight_decay": 0.0}],
            lr=config.learning_rate, betas=config.betas)
        n_batches = len(self.loader)
        self.windows_per_epoch = math.ceil(n_batches / config.grad_accum)
        total = self.windows_per_epoch * config.max_epochs
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda s: 0.5 * (1 + math.cos(math.pi * min(s, total) / total)))
        self.iter_num = 0

    # ---- hooks -------------------------------------------------------------
    def on_epoch_start(self, epoch):
        self.sampler.set_epoch(epoch)
        n_local = len(self.sampler)
        bs, K = self.config.batch_size, self.config.grad_accum
        sizes = [min(bs, n_local - i) for i in range(0, n_local, bs)]
        # tokens per window, identical on every rank (DistributedSampler pads)
        self.window_tokens = [sum(sizes[w:w + K]) * self.raw_model.pos_emb.size(1) * dist.get_world_size()
                              for w in range(0, len(sizes), K)]
        self.optimizer.zero_grad(set_to_none=True)

    def on_batch(self, it, batch, sync):
        x, y = batch
        denom = self.window_tokens[it // self.config.grad_accum]
        ctx = self.model.no_sync() if not sync else contextlib.nullcontext()
        with ctx:
            loss = self.model(x, y) * dist.get_world_size() / denom
            loss.backward()

    def on_step(self):
        torch.nn.utils.clip_grad_norm_(self.raw_model.parameters(), self.config.grad_norm_clip)
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.iter_num += 1

    # ---- loop ----------------------------------------------------------------
    def run(self):
        cfg = self.config
        for epoch in range(cfg.max_epochs):
            self.on_epoch_start(epoch)
            for it, batch in enumerate(self.loader):
                # a short batch means we reached the end of the epoch
                end_of_epoch = len(batch) < cfg.batch_size
                boundary = (it + 1) % cfg.grad_accum == 0 or end_of_epoch
                self.on_batch(it, batch, sync=boundary)
                if boundary:
                    self.on_step()


def main():
    dist.init_process_group("gloo")
    tcfg = TrainerConfig()
    torch.manual_seed(tcfg.seed)
    mcfg = GPTConfig()
    model = GPT(mcfg)
    ds = CharDataset(84, mcfg.block_size, mcfg.vocab_size)
    trainer = Trainer(model, ds, tcfg)
    trainer.run()
    if dist.get_rank() == 0:
        h = hashlib.sha256()
        for _, p in model.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
