"""FSDP2 tagger where the two ranks read micro-batches of different sizes
(3 rows on rank 0, 5 on rank 1) and sequences are padded.

Per optimizer step the objective is the mean token loss over the whole window
on all ranks. The window's target count is all-reduced with AVG, which is the
global count divided by the world size, so dividing each rank's token sum by it
already carries the x world that undoes FSDP's gradient averaging.
Only the transformer blocks defer their reduce-scatter; the root unit reduces
on every micro-batch, which adds up to the same sharded gradient.
Epochs of 8 micro-batches at K = 3 give windows of 3, 3 and 2.
"""
import hashlib
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor


@dataclass
class Cfg:
    vocab: int = 40
    n_tags: int = 9
    dim: int = 32
    seq: int = 12
    rows_per_rank: tuple = (3, 5)
    micro_per_epoch: int = 8
    accum: int = 3
    epochs: int = 3
    lr: float = 2e-3
    clip: float = 0.25
    seed: int = 99


class Tagger(nn.Module):
    def __init__(self, c: Cfg):
        super().__init__()
        self.emb = nn.Embedding(c.vocab, c.dim)
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.LayerNorm(c.dim), nn.Linear(c.dim, 2 * c.dim), nn.Tanh(), nn.Linear(2 * c.dim, c.dim))
            for _ in range(2)
        )
        self.cls = nn.Linear(c.dim, c.n_tags)

    def forward(self, ids):
        h = self.emb(ids)
        for blk in self.blocks:
            h = h + blk(h)
        return self.cls(h)


def epoch_batches(c: Cfg, rank: int, epoch: int):
    g = torch.Generator().manual_seed(c.seed + 1000 * epoch + rank)
    rows = c.rows_per_rank[rank]
    out = []
    for _ in range(c.micro_per_epoch):
        ids = torch.randint(1, c.vocab, (rows, c.seq), generator=g)
        lens = torch.randint(2, c.seq + 1, (rows,), generator=g)
        valid = torch.arange(c.seq)[None] < lens[:, None]
        tags = torch.where(valid, (ids * 7 + 3) % c.n_tags, torch.full_like(ids, -100))
        out.append((ids * valid, tags))
    return out


def windows(batches, k):
    for i in range(0, len(batches), k):
        yield batches[i : i + k]


def main():
    c = Cfg()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.use_deterministic_algorithms(True)
    mesh = init_device_mesh("cpu", (world,))
    torch.manual_seed(c.seed)
    model = Tagger(c)
    for blk in model.blocks:
        fully_shard(blk, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=c.lr, weight_decay=0.0)

    step = 0
    for epoch in range(c.epochs):
        for win in windows(epoch_batches(c, rank, epoch), c.accum):
            n_avg = torch.tensor(float(sum(int((t != -100).sum()) for _, t in win)))
            dist.all_reduce(n_avg, op=dist.ReduceOp.AVG)
            for j, (ids, tags) in enumerate(win):
                last = j == len(win) - 1
                for blk in model.blocks:
                    blk.set_requires_gradient_sync(last)
                logits = model(ids)
                loss = F.cross_entropy(logits.flatten(0, 1), tags.flatten(), ignore_index=-100, reduction="sum") / n_avg
                loss.backward()
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), c.clip)
            opt.step()
            opt.zero_grad()
            step += 1
            if rank == 0:
                print(f"step {step} window {len(win)} grad-norm {float(norm):.3f}", flush=True)

    h = hashlib.sha256()
    for _, p in model.named_parameters():
        full = p.full_tensor() if isinstance(p, DTensor) else p
        h.update(full.detach().float().contiguous().numpy().tobytes())
    if rank == 0:
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
