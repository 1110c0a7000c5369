"""Step-based FSDP2 training of a tiny causal LM whose windows cross epochs.

The trainer counts micro-batches globally: an epoch has 5 micro-batches per
rank and a window has 3, so windows freely span the epoch boundary (the data
stream simply continues with the next epoch's shuffle).  The position table is
frozen, the gradient is clipped at 0.3 once per window.  Two ranks, gloo.
"""
import hashlib
import itertools
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.fsdp import fully_shard
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


@dataclass
class LMConfig:
    vocab: int = 96
    dim: int = 48
    heads: int = 4
    layers: int = 2
    seq_len: int = 16
    n_seqs: int = 40
    micro_bs: int = 4
    accum: int = 3
    max_steps: int = 10
    lr: float = 3e-3
    clip: float = 0.3
    seed: int = 5


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(c.dim), nn.LayerNorm(c.dim)
        self.attn = nn.MultiheadAttention(c.dim, c.heads, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(c.dim, 4 * c.dim), nn.GELU(), nn.Linear(4 * c.dim, c.dim))

    def forward(self, x, mask):
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class TinyLM(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.tok = nn.Embedding(c.vocab, c.dim)
        self.pos = nn.Embedding(c.seq_len, c.dim)
        self.blocks = nn.ModuleList([Block(c) for _ in range(c.layers)])
        self.ln_f = nn.LayerNorm(c.dim)
        self.lm_head = nn.Linear(c.dim, c.vocab, bias=False)

    def forward(self, ids):
        T = ids.size(1)
        mask = torch.triu(torch.full((T, T), float("-inf")), diagonal=1)
        x = self.tok(ids) + self.pos(torch.arange(T))
        for b in self.blocks:
            x = b(x, mask)
        return self.lm_head(self.ln_f(x))


def corpus(c):
    g = torch.Generator().manual_seed(c.seed)
    start = torch.randint(0, c.vocab, (c.n_seqs, 1), generator=g)
    step = torch.randint(1, 5, (c.n_seqs, 1), generator=g)
    seqs = (start + step * torch.arange(c.seq_len + 1)) % c.vocab
    return TensorDataset(seqs)


class StepTrainer:
    def __init__(self, c: LMConfig):
        self.c = c
        self.rank = dist.get_rank()
        torch.manual_seed(c.seed)
        model = TinyLM(c)
        model.pos.weight.requires_grad_(False)
        for b in model.blocks:
            fully_shard(b)
        fully_shard(model)
        self.model = model
        self.opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=c.lr)
        ds = corpus(c)
        self.sampler = DistributedSampler(ds, shuffle=True, seed=c.seed)
        self.loader = DataLoader(ds, batch_size=c.micro_bs, sampler=self.sampler, drop_last=True)
        self.micro = 0
        self.step = 0

    def stream(self):
        for epoch in itertools.count():
            self.sampler.set_epoch(epoch)
            for (seq,) in self.loader:
                yield epoch, seq

    def micro_step(self, seq):
        boundary = (self.micro + 1) % self.c.accum == 0
        self.model.set_requires_gradient_sync(boundary)
        logits = self.model(seq[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), seq[:, 1:].reshape(-1))
        (loss / self.c.accum).backward()
        self.micro += 1
        return boundary, loss.item()

    def apply_update(self):
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.c.clip)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        self.step += 1
        return norm

    def train(self):
        for epoch, seq in self.stream():
            boundary, loss = self.micro_step(seq)
            if boundary:
                norm = self.apply_update()
                if self.rank == 0:
                    gn = norm.full_tensor() if hasattr(norm, "full_tensor") else norm
                    print(f"step {self.step} epoch {epoch} micro {self.micro} loss {loss:.3f} gnorm {gn.item():.3f}")
                if self.step == self.c.max_steps:
                    break

    def sha256(self):
        h = hashlib.sha256()
        for _, p in self.model.named_parameters():
            t = p.full_tensor() if hasattr(p, "full_tensor") else p
            h.update(t.detach().float().contiguous().numpy().tobytes())
        return h.hexdigest()


def main():
    dist.init_process_group("gloo")
    t = StepTrainer(LMConfig())
    t.train()
    digest = t.sha256()
    if t.rank == 0:
        print(f"FINAL_SHA256 {digest}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
