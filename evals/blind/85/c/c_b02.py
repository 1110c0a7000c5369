"""minGPT-style Trainer on 2 DDP ranks (torchrun) with gradient accumulation.

LR schedule as in minGPT: linear warm-up then cosine decay measured in
processed (non-masked) target tokens; final_tokens is the token budget of the
whole run.
"""
import hashlib
import math
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP


class CfgNode:
    def __init__(self, **kw):
        self.__dict__.update(kw)


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.ln1 = nn.LayerNorm(c.n_embd)
        self.attn = nn.MultiheadAttention(c.n_embd, c.n_head, batch_first=True)
        self.ln2 = nn.LayerNorm(c.n_embd)
        self.mlp = nn.Sequential(nn.Linear(c.n_embd, 4 * c.n_embd), nn.GELU(), nn.Linear(4 * c.n_embd, c.n_embd))
        self.register_buffer("mask", torch.triu(torch.ones(c.block_size, c.block_size, dtype=torch.bool), 1))

    def forward(self, x):
        T = x.size(1)
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=self.mask[:T, :T], need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.tok_emb = nn.Embedding(c.vocab_size, c.n_embd)
        self.pos_emb = nn.Parameter(torch.zeros(1, c.block_size, c.n_embd))
        self.blocks = nn.Sequential(*[Block(c) for _ in range(c.n_layer)])
        self.ln_f = nn.LayerNorm(c.n_embd)
        self.head = nn.Linear(c.n_embd, c.vocab_size, bias=False)

    def forward(self, idx, targets=None):
        x = self.tok_emb(idx) + self.pos_emb[:, : idx.size(1)]
        logits = self.head(self.ln_f(self.blocks(x)))
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)
        return logits, loss


class CharDataset(torch.utils.data.Dataset):
    def __init__(self, n, block_size, vocab, seed):
        g = torch.Generator().manual_seed(seed)
        self.data = torch.randint(0, vocab, (n, block_size + 1), generator=g)
        self.keep = torch.randint(block_size // 2, block_size + 1, (n,), generator=g)

    def __len__(self):
        return len(self.data)

    def __getitem__(self, i):
        x, y = self.data[i, :-1].clone(), self.data[i, 1:].clone()
        y[self.keep[i]:] = -1  # padded tail, not trained on
        return x, y


class Trainer:
    def __init__(self, config, model, train_dataset):
        self.config = config
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.model = DDP(model)
        self.train_dataset = train_dataset
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=config.learning_rate, betas=config.betas)
        self.tokens = 0

    def set_lr(self, y):
        config = self.config
        self.tokens += (y >= 0).sum().item()
        if self.tokens < config.warmup_tokens:
            lr_mult = float(self.tokens) / float(max(1, config.warmup_tokens))
        else:
            progress = float(self.tokens - config.warmup_tokens) / float(max(1, config.final_tokens - config.warmup_tokens))
            lr_mult = max(0.1, 0.5 * (1.0 + math.cos(math.pi * progress)))
        for pg in self.optimizer.param_groups:
            pg["lr"] = config.learning_rate * lr_mult

    def run(self):
        config, model = self.config, self.model
        sampler = torch.utils.data.DistributedSampler(self.train_dataset, shuffle=True, seed=0)
        loader = torch.utils.data.DataLoader(self.train_dataset, batch_size=config.batch_size, sampler=sampler)
        it = 0
        for epoch in range(config.max_epochs):
            sampler.set_epoch(epoch)
            for x, y in loader:
                last = (it + 1) % config.grad_accum == 0
                model.require_backward_grad_sync = last
                _, loss = model(x, y)
                (loss / config.grad_accum).backward()
                self.set_lr(y)
                if last:
                    torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_norm_clip)
                    self.optimizer.step()
                    self.optimizer.zero_grad(set_to_none=True)
                it += 1


def main():
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    torch.manual_seed(0)
    mconf = CfgNode(vocab_size=32, block_size=16, n_embd=32, n_head=2, n_layer=2)
    # every sample is the same length so each micro-batch has the same weight
    ds = CharDataset(n=192, block_size=16, vocab=32, seed=1)
    ds.keep.fill_(16)
    tconf = CfgNode(max_epochs=3, batch_size=8, grad_accum=3, learning_rate=3e-3, betas=(0.9, 0.95),
                    grad_norm_clip=1.0, warmup_tokens=512)
    tconf.final_tokens = tconf.max_epochs * len(ds) * mconf.block_size
    trainer = Trainer(tconf, GPT(mconf), ds)
    trainer.run()
    if dist.get_rank() == 0:
        h = hashlib.sha256()
        for _, p in trainer.model.module.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        print("FINAL_SHA256", h.hexdigest(), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
