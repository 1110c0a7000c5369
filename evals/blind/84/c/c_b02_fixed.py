"""Token-level knowledge distillation, hand-rolled data parallelism on spawned ranks.

A frozen teacher LM distils into a smaller student. Sequences are padded to a common
length; padding positions are masked out. The loss of a window is the KL summed over
all valid tokens of the window on all ranks, divided by that all-ranks token count, so
each micro-batch's loss is divided by the global count up front.
"""
import argparse
import hashlib
import os
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F


class TinyLM(nn.Module):
    def __init__(self, vocab, dim, layers, max_len=32):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(max_len, dim)
        layer = nn.TransformerEncoderLayer(dim, nhead=2, dim_feedforward=2 * dim, dropout=0.0,
                                           batch_first=True, norm_first=True)
        self.body = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab)

    def forward(self, ids, pad_mask):
        T = ids.size(1)
        causal = torch.ones(T, T, dtype=torch.bool).triu(1)
        x = self.emb(ids) + self.pos(torch.arange(T))
        x = self.body(x, mask=causal, src_key_padding_mask=~pad_mask)
        return self.head(self.norm(x))


@dataclass
class DistillConfig:
    vocab: int = 80
    seq_len: int = 20
    micro_batch: int = 4
    grad_accum: int = 4
    num_steps: int = 10
    lr: float = 0.5
    momentum: float = 0.9
    temperature: float = 2.0
    seed: int = 7
    teacher_dims: tuple = field(default=(64, 2))
    student_dims: tuple = field(default=(32, 1))


class DistillTrainer:
    def __init__(self, cfg, rank, world):
        self.cfg, self.rank, self.world = cfg, rank, world
        torch.manual_seed(cfg.seed)
        self.teacher = TinyLM(cfg.vocab, *cfg.teacher_dims).eval()
        for p in self.teacher.parameters():
            p.requires_grad_(False)
        self.student = TinyLM(cfg.vocab, *cfg.student_dims)
        self.opt = torch.optim.SGD(self.student.parameters(), lr=cfg.lr, momentum=cfg.momentum)

    def micro_batch(self, step, k):
        c = self.cfg
        g = torch.Generator().manual_seed(c.seed * 100003 + step * 101 + k * 11 + self.rank)
        ids = torch.randint(0, c.vocab, (c.micro_batch, c.seq_len), generator=g)
        lengths = torch.randint(3, c.seq_len + 1, (c.micro_batch,), generator=g)
        mask = torch.arange(c.seq_len)[None, :] < lengths[:, None]
        return ids, mask

    def kd_sum(self, ids, mask):
        t = self.cfg.temperature
        with torch.no_grad():
            t_logp = F.log_softmax(self.teacher(ids, mask) / t, dim=-1)
        s_logp = F.log_softmax(self.student(ids, mask) / t, dim=-1)
        kl = (t_logp.exp() * (t_logp - s_logp)).sum(-1) * t * t
        return (kl * mask).sum()

    def global_token_count(self, window):
        n = torch.tensor(float(sum(int(m.sum()) for _, m in window)))
        dist.all_reduce(n, op=dist.ReduceOp.SUM)
        return n

    def sync_grads(self):
        for p in self.student.parameters():
            if p.grad is not None:
                # the loss is already over the all-ranks token count: a plain sum
                dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)

    def train_step(self, step):
        window = [self.micro_batch(step, k) for k in range(self.cfg.grad_accum)]
        n_tokens = self.global_token_count(window)
        total = 0.0
        for ids, mask in window:
            loss = self.kd_sum(ids, mask) / n_tokens
            loss.backward()
            total += loss.item()
        self.sync_grads()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return total

    def fit(self):
        for step in range(self.cfg.num_steps):
            local = self.train_step(step)
            if self.rank == 0 and step % 3 == 0:
                print(f"step {step} local kd {local:.4f}", flush=True)


def run(rank, world, port):
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.use_deterministic_algorithms(True)
    trainer = DistillTrainer(DistillConfig(), rank, world)
    trainer.fit()
    if rank == 0:
        flat = torch.cat([p.detach().float().reshape(-1) for _, p in trainer.student.named_parameters()])
        if os.environ.get("PARAM_DUMP"):
            torch.save(flat, os.environ["PARAM_DUMP"])
        print("FINAL_SHA256", hashlib.sha256(flat.numpy().tobytes()).hexdigest(), flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, default=38203)
    ap.add_argument("--nprocs", type=int, default=2)
    a = ap.parse_args()
    mp.spawn(run, args=(a.nprocs, a.port), nprocs=a.nprocs)
