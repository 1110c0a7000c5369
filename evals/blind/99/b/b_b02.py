"""FSDP2 (fully_shard) bf16 token classifier, gradient accumulation.

Parameters are stored in bf16 to halve memory; gradients are reduced in fp32
(MixedPrecisionPolicy.reduce_dtype).  Loss is a token mean over the whole
window: each micro-batch's summed CE is divided by the window's all-ranks token
count and multiplied by the world size (FSDP2 averages over ranks).
"""
import hashlib
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard


@dataclass
class Cfg:
    vocab: int = 64
    d_model: int = 32
    n_layers: int = 2
    n_cls: int = 8
    seq: int = 12
    micro_bs: int = 4
    grad_accum: int = 8
    steps: int = 10
    lr: float = 2e-3
    param_dtype: torch.dtype = torch.bfloat16
    reduce_dtype: torch.dtype = torch.float32


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 4 * d)
        self.fc2 = nn.Linear(4 * d, d)

    def forward(self, x):
        return x + self.fc2(F.gelu(self.fc1(self.norm(x))))


class Tagger(nn.Module):
    def __init__(self, c: Cfg):
        super().__init__()
        self.emb = nn.Embedding(c.vocab, c.d_model)
        self.blocks = nn.ModuleList([Block(c.d_model) for _ in range(c.n_layers)])
        self.head = nn.Linear(c.d_model, c.n_cls)

    def forward(self, tok):
        h = self.emb(tok)
        for b in self.blocks:
            h = b(h)
        return self.head(h)


def synth_batches(c: Cfg, rank: int):
    g = torch.Generator().manual_seed(7 + rank)
    n = c.steps * c.grad_accum
    out = []
    for _ in range(n):
        tok = torch.randint(0, c.vocab, (c.micro_bs, c.seq), generator=g)
        lab = (tok * 3 + 1) % c.n_cls
        lengths = torch.randint(3, c.seq + 1, (c.micro_bs,), generator=g)
        pad = torch.arange(c.seq)[None, :] >= lengths[:, None]
        lab[pad] = -100
        out.append((tok, lab))
    return out


class Trainer:
    def __init__(self, c: Cfg):
        self.c = c
        self.rank = dist.get_rank()
        self.world = dist.get_world_size()
        torch.manual_seed(0)
        model = Tagger(c).to(c.param_dtype)
        mesh = init_device_mesh("cpu", (self.world,))
        mp = MixedPrecisionPolicy(reduce_dtype=c.reduce_dtype)
        for blk in model.blocks:
            fully_shard(blk, mesh=mesh, mp_policy=mp)
        fully_shard(model, mesh=mesh, mp_policy=mp)
        self.model = model
        self.opt = torch.optim.AdamW(model.parameters(), lr=c.lr, weight_decay=0.0, eps=1e-6)

    def window_tokens(self, window):
        n = torch.tensor(sum(int((lab != -100).sum()) for _, lab in window), dtype=torch.float64)
        dist.all_reduce(n)
        return n.item()

    def micro_step(self, tok, lab, n_tokens, is_last):
        logits = self.model(tok).float()
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), lab.view(-1),
                               ignore_index=-100, reduction="sum")
        (loss * self.world / n_tokens).backward()
        return loss.detach()

    def fit(self, batches):
        K = self.c.grad_accum
        for step in range(self.c.steps):
            window = batches[step * K:(step + 1) * K]
            n_tok = self.window_tokens(window)
            tot = 0.0
            for i, (tok, lab) in enumerate(window):
                tot += self.micro_step(tok, lab, n_tok, i == K - 1).item()
            self.opt.step()
            self.opt.zero_grad(set_to_none=True)
            if self.rank == 0 and step % 3 == 0:
                print(f"step {step} local loss/token {tot / n_tok * self.world:.4f}", flush=True)


def final_hash(model):
    h = hashlib.sha256()
    for _, p in model.named_parameters():
        full = p.full_tensor() if hasattr(p, "full_tensor") else p
        h.update(full.detach().float().contiguous().numpy().tobytes())
    return h.hexdigest()


def main():
    dist.init_process_group("gloo")
    c = Cfg()
    tr = Trainer(c)
    tr.fit(synth_batches(c, dist.get_rank()))
    digest = final_hash(tr.model)
    if dist.get_rank() == 0:
        print("FINAL_SHA256", digest, flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
