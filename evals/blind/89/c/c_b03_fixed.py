"""minGPT-style character model on 2 DDP ranks (torchrun), preempted and resumed.

Accumulation windows run across epoch boundaries (the micro-step counter is
global, not per epoch). A preemption checkpoint is written at the end of epoch 1,
which falls inside a window, so it carries each rank's partial gradient; a fresh
trainer (new model, optimizer, scheduler) restores it and finishes the run.
"""
import hashlib
import os
import shutil
import tempfile

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP


class Config:
    vocab_size = 40
    block_size = 16
    n_embd = 32
    n_head = 4
    n_layer = 2
    micro_batch = 4
    grad_accum = 4
    batches_per_epoch = 10
    epochs = 2
    lr = 3e-3
    warmup = 2


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(c.n_embd), nn.LayerNorm(c.n_embd)
        self.attn = nn.MultiheadAttention(c.n_embd, c.n_head, batch_first=True)
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
        self.tok = nn.Embedding(c.vocab_size, c.n_embd)
        self.pos = nn.Parameter(torch.zeros(1, c.block_size, c.n_embd))
        self.blocks = nn.Sequential(*[Block(c) for _ in range(c.n_layer)])
        self.ln_f = nn.LayerNorm(c.n_embd)
        self.head = nn.Linear(c.n_embd, c.vocab_size, bias=False)

    def forward(self, idx, targets):
        x = self.tok(idx) + self.pos[:, : idx.size(1)]
        logits = self.head(self.ln_f(self.blocks(x)))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))


def make_corpus(c, rank):
    g = torch.Generator().manual_seed(31 + rank)
    n = c.batches_per_epoch * c.micro_batch
    base = torch.randint(0, c.vocab_size, (n, 1), generator=g)
    steps = torch.randint(1, 4, (n, c.block_size + 1), generator=g).cumsum(1)
    return (base + steps) % c.vocab_size


class Trainer:
    def __init__(self, c, rank, ckpt_dir):
        self.c, self.rank, self.ckpt_dir = c, rank, ckpt_dir
        torch.manual_seed(0)
        self.model = DDP(GPT(c))
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=c.lr, betas=(0.9, 0.95), weight_decay=0.1)
        self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, lambda s: min(1.0, (s + 1) / c.warmup))
        self.data = make_corpus(c, rank)
        self.micro_step = 0
        self.global_step = 0
        self.epoch = 0

    def run_epoch(self):
        c = self.c
        perm = torch.randperm(len(self.data), generator=torch.Generator().manual_seed(self.epoch * 10 + self.rank))
        for b in range(c.batches_per_epoch):
            seq = self.data[perm[b * c.micro_batch:(b + 1) * c.micro_batch]]
            boundary = (self.micro_step + 1) % c.grad_accum == 0
            self.model.require_backward_grad_sync = boundary
            loss = self.model(seq[:, :-1], seq[:, 1:])
            (loss / c.grad_accum).backward()
            self.micro_step += 1
            if boundary:
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
                self.opt.step()
                self.sched.step()
                self.opt.zero_grad(set_to_none=True)
                self.global_step += 1
        self.epoch += 1

    def save(self):
        state = {
            "model": self.model.module.state_dict(),
            "opt": self.opt.state_dict(),
            "sched": self.sched.state_dict(),
            "grads": {n: p.grad.clone() for n, p in self.model.module.named_parameters() if p.grad is not None},
            "global_step": self.global_step,
            "micro_step": self.micro_step,
            "epoch": self.epoch,
        }
        torch.save(state, os.path.join(self.ckpt_dir, f"rank{self.rank}.pt"))

    def load(self):
        state = torch.load(os.path.join(self.ckpt_dir, f"rank{self.rank}.pt"))
        self.model.module.load_state_dict(state["model"])
        self.opt.load_state_dict(state["opt"])
        self.sched.load_state_dict(state["sched"])
        for n, p in self.model.module.named_parameters():
            if n in state["grads"]:
                p.grad = state["grads"][n].clone()
        self.global_step = state["global_step"]
        self.micro_step = state["micro_step"]
        self.epoch = state["epoch"]


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.use_deterministic_algorithms(True)
    c = Config()
    ckpt_dir = tempfile.mkdtemp(prefix=f"c_b03_r{rank}_")

    first = Trainer(c, rank, ckpt_dir)
    first.run_epoch()
    first.save()
    del first  # preempted

    trainer = Trainer(c, rank, ckpt_dir)
    trainer.load()
    while trainer.epoch < c.epochs:
        trainer.run_epoch()

    if rank == 0:
        h = hashlib.sha256()
        for _, p in trainer.model.module.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
    shutil.rmtree(ckpt_dir, ignore_errors=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
