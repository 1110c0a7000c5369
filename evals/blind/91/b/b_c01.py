"""FSDP2 masked-token training with accumulation windows that follow the epoch.

Each window is normalised by its valid-token count over all ranks (x world size, since
FSDP2 averages the reduce-scatter). The epoch's last window is short. The optimizer is
cleared at the top of every micro-step: while gradient sync is off, FSDP2 keeps the
accumulating gradient on its unsharded parameters, so only the (empty) sharded .grad is hit.
"""
import hashlib
import math

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.fsdp import fully_shard


class Cfg:
    vocab = 50
    dim = 32
    seq = 12
    micro_bs = 4
    micro_per_epoch = 10     # per rank; K = 4 -> windows of 4, 4, 2
    accum = 4
    epochs = 2
    lr = 2e-3
    clip = 0.5
    pad = 0


class Mixer(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.ln = nn.LayerNorm(d)
        self.ff = nn.Sequential(nn.Linear(d, 2 * d), nn.SiLU(), nn.Linear(2 * d, d))

    def forward(self, h):
        return h + self.ff(self.ln(h))


class Net(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.tok = nn.Embedding(c.vocab, c.dim)
        self.layers = nn.ModuleList([Mixer(c.dim) for _ in range(2)])
        self.lm_head = nn.Linear(c.dim, c.vocab)

    def forward(self, idx):
        h = self.tok(idx)
        for layer in self.layers:
            h = layer(h)
        return self.lm_head(h)


def epoch_data(rank, epoch, c):
    g = torch.Generator().manual_seed(1000 * epoch + rank)
    out = []
    for _ in range(c.micro_per_epoch):
        x = torch.randint(1, c.vocab, (c.micro_bs, c.seq + 1), generator=g)
        lens = torch.randint(3, c.seq + 1, (c.micro_bs,), generator=g)
        pos = torch.arange(c.seq + 1)
        x = torch.where(pos[None] <= lens[:, None], x, torch.full_like(x, c.pad))
        out.append((x[:, :-1], x[:, 1:]))
    return out


def windows(micro_batches, k):
    for s in range(0, len(micro_batches), k):
        yield micro_batches[s:s + k]


def sha_of(model):
    h = hashlib.sha256()
    for _, p in model.named_parameters():
        h.update(p.full_tensor().detach().float().contiguous().numpy().tobytes())
    return h.hexdigest()


def main():
    c = Cfg()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(3)
    model = Net(c)
    for layer in model.layers:
        fully_shard(layer)
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=c.lr, betas=(0.9, 0.95))

    for epoch in range(c.epochs):
        for win in windows(epoch_data(rank, epoch, c), c.accum):
            n_valid = torch.tensor(float(sum((y != c.pad).sum() for _, y in win)))
            dist.all_reduce(n_valid)
            for j, (x, y) in enumerate(win):
                opt.zero_grad(set_to_none=True)
                model.set_requires_gradient_sync(j == len(win) - 1)
                logits = model(x)
                loss_sum = F.cross_entropy(logits.reshape(-1, c.vocab), y.reshape(-1),
                                           ignore_index=c.pad, reduction="sum")
                (loss_sum * world / n_valid).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), c.clip)
            opt.step()

    digest = sha_of(model)
    if rank == 0:
        print(f"FINAL_SHA256 {digest}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
