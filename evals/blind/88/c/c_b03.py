"""Token-level knowledge distillation, student under DDP, trainer split over methods.

Sequences are right-padded; the loss is the temperature-scaled KL over valid
(non-pad) tokens, normalised by the number of valid tokens in the window.
"""
import argparse
import contextlib
import hashlib

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

PAD = 0


def get_args():
    p = argparse.ArgumentParser()
    p.add_argument("--vocab", type=int, default=96)
    p.add_argument("--dim", type=int, default=48)
    p.add_argument("--seq-len", type=int, default=24)
    p.add_argument("--micro-bs", type=int, default=6)
    p.add_argument("--grad-accum", type=int, default=4)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--temperature", type=float, default=2.0)
    return p.parse_args()


class TinyLM(nn.Module):
    def __init__(self, vocab, dim, layers):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(torch.randn(64, dim) * 0.02)
        self.blocks = nn.ModuleList(nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim)) for _ in range(layers))
        self.ln = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)

    def forward(self, idx):
        x = self.emb(idx) + self.pos[: idx.size(1)]
        # causal mixing: running mean over the prefix
        x = torch.cumsum(x, 1) / torch.arange(1, idx.size(1) + 1).view(1, -1, 1)
        for b in self.blocks:
            x = x + b(x)
        return self.head(self.ln(x))


def final_sha(model):
    h = hashlib.sha256()
    for _, p in model.named_parameters():
        h.update(p.detach().to(torch.float32).contiguous().cpu().numpy().tobytes())
    return h.hexdigest()


class DistillTrainer:
    def __init__(self, args):
        self.args = args
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        torch.manual_seed(1234)
        self.teacher = TinyLM(args.vocab, args.dim, 3).eval()
        for p in self.teacher.parameters():
            p.requires_grad_(False)
        torch.manual_seed(99)
        self.student = DDP(TinyLM(args.vocab, args.dim, 1))
        self.opt = torch.optim.AdamW(self.student.parameters(), lr=args.lr, weight_decay=0.01)

    def make_batch(self, step, micro):
        a = self.args
        g = torch.Generator().manual_seed(100_000 * self.rank + 100 * step + micro)
        ids = torch.randint(1, a.vocab, (a.micro_bs, a.seq_len), generator=g)
        # rank 1 serves the long-document shard, rank 0 mostly short replies
        lo = 4 if self.rank == 0 else 12
        hi = 12 if self.rank == 0 else a.seq_len
        lens = torch.randint(lo, hi + 1, (a.micro_bs,), generator=g)
        mask = torch.arange(a.seq_len).view(1, -1) < lens.view(-1, 1)
        ids[~mask] = PAD
        return ids, mask

    def window_token_count(self, window):
        return sum(int(m.sum()) for _, m in window)

    def kd_loss_sum(self, ids, mask):
        T = self.args.temperature
        with torch.no_grad():
            t_logp = F.log_softmax(self.teacher(ids) / T, -1)
        s_logp = F.log_softmax(self.student(ids) / T, -1)
        kl = (t_logp.exp() * (t_logp - s_logp)).sum(-1)
        return (kl * mask).sum() * T * T

    def train_window(self, step):
        K = self.args.grad_accum
        window = [self.make_batch(step, m) for m in range(K)]
        n_tokens = self.window_token_count(window)
        total = 0.0
        for m, (ids, mask) in enumerate(window):
            ctx = self.student.no_sync() if m < K - 1 else contextlib.nullcontext()
            with ctx:
                loss = self.kd_loss_sum(ids, mask) / n_tokens
                loss.backward()
            total += loss.item()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return total

    def fit(self):
        for step in range(self.args.steps):
            loss = self.train_window(step)
            if self.rank == 0 and step % 4 == 0:
                print(f"step {step} kd {loss:.4f}")
        if self.rank == 0:
            print("FINAL_SHA256", final_sha(self.student.module))


def main():
    args = get_args()
    dist.init_process_group("gloo")
    torch.use_deterministic_algorithms(True)
    DistillTrainer(args).fit()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
