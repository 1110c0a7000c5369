"""Tiny GPT on padded documents, 2 ranks started with mp.spawn, no DDP wrapper.

The model is torch.compile'd; each rank keeps its own replica and the gradients are summed
by one flat all-reduce per optimizer step. A window is read ahead so the loss can be a token
sum over the number of target tokens in the whole window on all ranks (padding excluded).
8 micro-batches per epoch with 3 per window: windows of 3, 3 and 2 micro-batches.
A DataLoader worker does the padding.
"""
import hashlib
import math
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset, DistributedSampler

CFG = dict(
    vocab=48, block=16, d=32, heads=2, layers=2,
    micro_bs=3, accum=3, epochs=3, n_docs=48,
    lr=2e-3, min_lr=2e-4, warmup=2, wd=0.1, clip=1.0,
    seed=4242, world=2, port=49212, compile_backend="aot_eager",
)
PAD = 0


class Docs(Dataset):
    def __init__(self, cfg):
        g = torch.Generator().manual_seed(cfg["seed"])
        self.docs = []
        for _ in range(cfg["n_docs"]):
            n = int(torch.randint(5, cfg["block"] + 2, (1,), generator=g))
            start = int(torch.randint(1, cfg["vocab"], (1,), generator=g))
            step = int(torch.randint(1, 4, (1,), generator=g))
            seq = [(start + step * t) % (cfg["vocab"] - 1) + 1 for t in range(n)]
            self.docs.append(torch.tensor(seq))

    def __len__(self):
        return len(self.docs)

    def __getitem__(self, i):
        return self.docs[i]


class PadCollate:
    def __init__(self, block):
        self.block = block

    def __call__(self, docs):
        x = torch.full((len(docs), self.block), PAD, dtype=torch.long)
        y = torch.full((len(docs), self.block), -1, dtype=torch.long)
        for r, d in enumerate(docs):
            d = d[: self.block + 1]
            x[r, : len(d) - 1] = d[:-1]
            y[r, : len(d) - 1] = d[1:]
        return x, y


class Block(nn.Module):
    def __init__(self, d, h):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, h, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x, mask):
        a = self.ln1(x)
        x = x + self.attn(a, a, a, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.tok = nn.Embedding(c["vocab"], c["d"])
        self.pos = nn.Parameter(torch.zeros(c["block"], c["d"]))
        self.blocks = nn.ModuleList([Block(c["d"], c["heads"]) for _ in range(c["layers"])])
        self.ln_f = nn.LayerNorm(c["d"])
        self.head = nn.Linear(c["d"], c["vocab"], bias=False)
        self.head.weight = self.tok.weight
        nn.init.normal_(self.tok.weight, std=0.02)
        nn.init.normal_(self.pos, std=0.01)
        self.register_buffer("causal", torch.triu(torch.ones(c["block"], c["block"], dtype=torch.bool), 1), persistent=False)

    def forward(self, x, y):
        T = x.size(1)
        h = self.tok(x) + self.pos[:T]
        for b in self.blocks:
            h = b(h, self.causal[:T, :T])
        logits = self.head(self.ln_f(h))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), y.view(-1), ignore_index=-1, reduction="sum")


def lr_at(step, total, c):
    if step < c["warmup"]:
        return c["lr"] * (step + 1) / c["warmup"]
    r = (step - c["warmup"]) / max(1, total - c["warmup"])
    return c["min_lr"] + 0.5 * (1 + math.cos(math.pi * r)) * (c["lr"] - c["min_lr"])


def read_windows(loader, k):
    buf = []
    for mb in loader:
        buf.append(mb)
        if len(buf) == k:
            yield buf
            buf = []
    if buf:
        yield buf


def allreduce_grads(params):
    grads = [p.grad for p in params]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat, op=dist.ReduceOp.SUM)
    off = 0
    for g in grads:
        n = g.numel()
        g.copy_(flat[off:off + n].view_as(g))
        off += n


def run(rank, c):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(c["port"]))
    dist.init_process_group("gloo", rank=rank, world_size=c["world"])
    torch.set_num_threads(1)
    torch.manual_seed(c["seed"])

    raw = TinyGPT(c)
    model = torch.compile(raw, backend=c["compile_backend"])
    params = [p for p in raw.parameters() if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]
    other = [p for p in params if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": c["wd"]}, {"params": other, "weight_decay": 0.0}],
                            lr=c["lr"], betas=(0.9, 0.95))

    ds = Docs(c)
    sampler = DistributedSampler(ds, num_replicas=c["world"], rank=rank, shuffle=True, seed=c["seed"])
    loader = DataLoader(ds, batch_size=c["micro_bs"], sampler=sampler, num_workers=1,
                        persistent_workers=True, collate_fn=PadCollate(c["block"]))
    steps_per_epoch = math.ceil(len(loader) / c["accum"])
    total = steps_per_epoch * c["epochs"]

    step = 0
    for epoch in range(c["epochs"]):
        sampler.set_epoch(epoch)
        for window in read_windows(loader, c["accum"]):
            n_tok = torch.tensor(sum(int((y != -1).sum()) for _, y in window), dtype=torch.float64)
            dist.all_reduce(n_tok)
            for g in opt.param_groups:
                g["lr"] = lr_at(step, total, c)
            tot = 0.0
            for x, y in window:
                loss = model(x, y) / n_tok.item()
                loss.backward()
                tot += loss.item()
            allreduce_grads(params)
            torch.nn.utils.clip_grad_norm_(params, c["clip"])
            opt.step()
            opt.zero_grad(set_to_none=True)
            step += 1
        if rank == 0:
            print(f"epoch {epoch} step {step} loss/token (rank 0 share) {tot:.4f}")

    if rank == 0:
        h = hashlib.sha256()
        for _, p in raw.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        print("FINAL_SHA256", h.hexdigest())
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(run, args=(CFG,), nprocs=CFG["world"], join=True)
