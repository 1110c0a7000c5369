"""Toy seq2seq (GRU encoder-decoder) copy/reverse task, 2 spawned DDP ranks.

The objective is the mean cross-entropy over every non-pad target token that
goes into one optimizer step (all micro-batches, all ranks).
"""
import contextlib
import hashlib
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

PAD, BOS = 0, 1


@dataclass
class Cfg:
    vocab: int = 24
    d: int = 32
    micro_bs: int = 4
    accum: int = 4
    steps: int = 10
    lr: float = 3e-3
    port: int = 38604
    world: int = 2


class Seq2Seq(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.emb = nn.Embedding(c.vocab, c.d, padding_idx=PAD)
        self.enc = nn.GRU(c.d, c.d, batch_first=True)
        self.dec = nn.GRU(c.d, c.d, batch_first=True)
        self.out = nn.Linear(c.d, c.vocab)

    def forward(self, src, tgt_in):
        _, h = self.enc(self.emb(src))
        y, _ = self.dec(self.emb(tgt_in), h)
        return self.out(y)


def make_batch(c, g):
    lens = torch.randint(2, 12, (c.micro_bs,), generator=g)
    T = int(lens.max())
    src = torch.full((c.micro_bs, T), PAD)
    tgt = torch.full((c.micro_bs, T + 1), PAD)
    for i, L in enumerate(lens.tolist()):
        s = torch.randint(2, c.vocab, (L,), generator=g)
        src[i, :L] = s
        tgt[i, 0] = BOS
        tgt[i, 1:L + 1] = s.flip(0)
    return src, tgt[:, :-1], tgt[:, 1:]


class Seq2SeqTrainer:
    def __init__(self, c, rank):
        self.c, self.rank = c, rank
        torch.manual_seed(0)
        self.model = DDP(Seq2Seq(c))
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=c.lr, weight_decay=0.01)
        self.crit = nn.CrossEntropyLoss(ignore_index=PAD, reduction="sum")
        self.g = torch.Generator().manual_seed(1000 + rank)

    def micro_step(self, batch, last, denom):
        src, tin, tout = batch
        ctx = self.model.no_sync() if not last else contextlib.nullcontext()
        with ctx:
            logits = self.model(src, tin)
            loss = self.crit(logits.reshape(-1, logits.size(-1)), tout.reshape(-1))
            (loss * dist.get_world_size() / denom).backward()
        return loss.detach()

    def train(self):
        c = self.c
        for step in range(c.steps):
            batches = [make_batch(c, self.g) for _ in range(c.accum)]
            n_tok = torch.stack([(b[2] != PAD).sum() for b in batches]).sum().float()
            dist.all_reduce(n_tok)
            for k, b in enumerate(batches):
                self.micro_step(b, last=(k == c.accum - 1), denom=n_tok)
            self.opt.step()
            self.opt.zero_grad(set_to_none=True)


def worker(rank, c):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(c.port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=c.world)
    tr = Seq2SeqTrainer(c, rank)
    tr.train()
    if rank == 0:
        h = hashlib.sha256()
        for _, p in tr.model.module.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        print("FINAL_SHA256", h.hexdigest(), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(worker, args=(Cfg(),), nprocs=2, join=True)
