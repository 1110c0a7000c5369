"""minGPT-style Trainer class on DDP (torchrun), packed variable-length micro-batches.

The loss of a window is the sum of token losses divided by the window's token count
over all ranks (counted before the window), times the world size to undo DDP's mean.
Half-way the run checkpoints at an optimizer-step boundary, throws every object away
and resumes into freshly built model / optimizer / scheduler.
"""
import hashlib
import math
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

CKPT = "/tmp/wc87_c02_ckpt.pt"


class CfgNode:
    def __init__(self, **kw):
        self.__dict__.update(kw)


def get_default_config():
    return CfgNode(vocab_size=40, block_size=12, n_embd=32, seed=5, grad_accum=3, max_iters=14,
                   ckpt_iter=6, learning_rate=2e-3, warmup_iters=4, weight_decay=0.05, grad_norm_clip=1.0)


class MiniGPT(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.tok = nn.Embedding(c.vocab_size, c.n_embd)
        self.pos = nn.Embedding(c.block_size, c.n_embd)
        self.mix = nn.GRU(c.n_embd, c.n_embd, batch_first=True)
        self.ln = nn.LayerNorm(c.n_embd)
        self.head = nn.Linear(c.n_embd, c.vocab_size, bias=False)

    def forward(self, idx, targets, mask):
        x = self.tok(idx) + self.pos(torch.arange(idx.size(1)))
        x, _ = self.mix(x)
        logits = self.head(self.ln(x))
        tok_loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="none")
        return (tok_loss * mask.flatten()).sum(), mask.sum()


class Batcher:
    """Deterministic stream of micro-batches with 2..5 rows and ragged lengths."""

    def __init__(self, c, rank):
        self.c = c
        self.rank = rank

    def get(self, micro_index):
        g = torch.Generator().manual_seed(10_000 * self.rank + micro_index)
        rows = int(torch.randint(2, 6, (1,), generator=g))
        data = torch.randint(0, self.c.vocab_size, (rows, self.c.block_size + 1), generator=g)
        lens = torch.randint(3, self.c.block_size + 1, (rows,), generator=g)
        mask = (torch.arange(self.c.block_size)[None, :] < lens[:, None]).float()
        return data[:, :-1], data[:, 1:], mask


class Trainer:
    def __init__(self, c, rank, world):
        self.c, self.rank, self.world = c, rank, world
        torch.manual_seed(c.seed)
        self.raw = MiniGPT(c)
        self.model = DDP(self.raw)
        self.optimizer = torch.optim.AdamW(self.raw.parameters(), lr=c.learning_rate,
                                           weight_decay=c.weight_decay)
        lr_lambda = lambda it: min(1.0, (it + 1) / c.warmup_iters) * 0.5 * (1 + math.cos(math.pi * it / c.max_iters))
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lr_lambda)
        self.batcher = Batcher(c, rank)
        self.iter_num = 0

    def save(self):
        if self.rank == 0:
            torch.save({"model": self.raw.state_dict(), "optimizer": self.optimizer.state_dict(),
                        "scheduler": self.scheduler.state_dict(), "iter_num": self.iter_num}, CKPT)
        dist.barrier()

    def load(self):
        sd = torch.load(CKPT, weights_only=False)
        self.raw.load_state_dict(sd["model"])
        self.optimizer.load_state_dict(sd["optimizer"])
        self.scheduler.load_state_dict(sd["scheduler"])
        self.iter_num = sd["iter_num"]

    def run(self, stop_at):
        c, K = self.c, self.c.grad_accum
        while self.iter_num < stop_at:
            micro = [self.batcher.get(self.iter_num * K + k) for k in range(K)]
            n_tok = torch.tensor(sum(m[2].sum() for m in micro))
            dist.all_reduce(n_tok)
            for k, (x, y, m) in enumerate(micro):
                self.model.require_backward_grad_sync = k == K - 1
                loss_sum, _ = self.model(x, y, m)
                (loss_sum * self.world / n_tok).backward()
            torch.nn.utils.clip_grad_norm_(self.raw.parameters(), c.grad_norm_clip)
            self.optimizer.step()
            self.scheduler.step()
            self.optimizer.zero_grad(set_to_none=True)
            self.iter_num += 1
            if self.rank == 0 and self.iter_num % 4 == 0:
                print(f"iter {self.iter_num} loss {loss_sum.item() / m.sum().item():.4f}", flush=True)


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)
    c = get_default_config()

    trainer = Trainer(c, rank, world)
    trainer.run(stop_at=c.ckpt_iter)
    trainer.save()
    del trainer

    trainer = Trainer(c, rank, world)  # fresh objects, as after a preemption
    trainer.load()
    trainer.run(stop_at=c.max_iters)

    if rank == 0:
        h = hashlib.sha256()
        for _, p in trainer.raw.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
        os.remove(CKPT)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
