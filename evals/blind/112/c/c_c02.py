"""FSDP2 token-level LM trainer: vocabulary grown before sharding, bf16 parameters with fp32
gradient reduction (MixedPrecisionPolicy), activation checkpointing, ragged sequences whose
loss is a token sum over the window's all-ranks token count (x W, since FSDP2 averages)."""
import hashlib
import os
from types import SimpleNamespace

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.utils.checkpoint import checkpoint

CFG = SimpleNamespace(base_vocab=40, added=6, dim=32, seq=14, micro_bs=4, K=3, steps=8,
                      lr=2e-3, port=49208)


class Layer(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.ln = nn.LayerNorm(d)
        self.up = nn.Linear(d, 3 * d)
        self.down = nn.Linear(3 * d, d)

    def forward(self, x):
        return x + self.down(F.silu(self.up(self.ln(x))))


class LM(nn.Module):
    def __init__(self, vocab, d):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.layers = nn.ModuleList([Layer(d) for _ in range(2)])
        self.ln_f = nn.LayerNorm(d)
        self.out = nn.Linear(d, vocab, bias=False)

    def forward(self, ids):
        h = self.tok(ids)
        for l in self.layers:
            h = checkpoint(l, h, use_reentrant=False)
        return self.out(self.ln_f(h))

    def grow_vocab(self, n_new):
        old_t, old_o = self.tok, self.out
        V = old_t.num_embeddings + n_new
        t, o = nn.Embedding(V, old_t.embedding_dim), nn.Linear(old_o.in_features, V, bias=False)
        with torch.no_grad():
            t.weight[: old_t.num_embeddings] = old_t.weight
            t.weight[old_t.num_embeddings:] = old_t.weight.mean(0)
            o.weight[: old_o.out_features] = old_o.weight
            o.weight[old_o.out_features:] = 0.0
        self.tok, self.out = t, o


def micro_batch(rank, step, m):
    g = torch.Generator().manual_seed(31337 + 97 * step + 13 * m + rank)
    V = CFG.base_vocab + CFG.added
    ids = torch.randint(0, V, (CFG.micro_bs, CFG.seq + 1), generator=g)
    lengths = torch.randint(3, CFG.seq + 1, (CFG.micro_bs,), generator=g)
    labels = ids[:, 1:].clone()
    labels[torch.arange(CFG.seq)[None, :] >= lengths[:, None]] = -100
    return ids[:, :-1], labels


class Runner:
    def __init__(self, rank, world):
        self.rank, self.world = rank, world
        torch.manual_seed(0)
        lm = LM(CFG.base_vocab, CFG.dim)
        lm.grow_vocab(CFG.added)
        mp_policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        for l in lm.layers:
            fully_shard(l, mp_policy=mp_policy)
        self.model = fully_shard(lm, mp_policy=mp_policy)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=CFG.lr, betas=(0.9, 0.95))

    def window_tokens(self, batches):
        n = torch.tensor(float(sum((lab != -100).sum().item() for _, lab in batches)))
        dist.all_reduce(n)
        return n

    def train_step(self, step):
        batches = [micro_batch(self.rank, step, m) for m in range(CFG.K)]
        total = self.window_tokens(batches)
        for m, (ids, lab) in enumerate(batches):
            self.model.set_requires_gradient_sync(m == CFG.K - 1)
            logits = self.model(ids)
            loss = F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), lab.reshape(-1),
                                   ignore_index=-100, reduction="sum")
            (loss * self.world / total).backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)

    def run(self):
        for s in range(CFG.steps):
            self.train_step(s)


def digest(model):
    h = hashlib.sha256()
    for _, p in model.named_parameters():
        h.update(p.full_tensor().detach().float().contiguous().numpy().tobytes())
    return h.hexdigest()


def entry(rank, world):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(CFG.port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    r = Runner(rank, world)
    r.run()
    d = digest(r.model)
    if rank == 0:
        print("FINAL_SHA256", d, flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(entry, args=(2,), nprocs=2, join=True)
