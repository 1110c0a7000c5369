"""DDP (bucket-view gradients, fp32 averaging comm hook) training a masked-token tagger.
Objective per optimizer step: mean cross-entropy over every valid (non-pad)
token of the window, all ranks. K micro-batches per window, no_sync on all
but the last."""
import contextlib
import hashlib
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

PAD = -100
CFG = dict(vocab=80, tags=12, dim=40, seq=20, micro_bs=4, accum=4, steps=9, lr=0.05)


class Tagger(nn.Module):
    def __init__(self, vocab, tags, dim):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.conv = nn.Conv1d(dim, dim, 3, padding=1)
        self.ff = nn.Sequential(nn.ReLU(), nn.Linear(dim, dim), nn.ReLU(), nn.Linear(dim, tags))

    def forward(self, x):
        h = self.emb(x)
        h = h + self.conv(h.transpose(1, 2)).transpose(1, 2)
        return self.ff(h)


def shard(rank, world):
    g = torch.Generator().manual_seed(5)
    n = CFG["steps"] * CFG["accum"] * CFG["micro_bs"] * world
    x = torch.randint(0, CFG["vocab"], (n, CFG["seq"]), generator=g)
    y = (x * 7 + 3) % CFG["tags"]
    lens = torch.randint(2, CFG["seq"] + 1, (n,), generator=g)
    y[torch.arange(CFG["seq"])[None] >= lens[:, None]] = PAD
    x, y = x[rank::world], y[rank::world]
    return list(zip(x.split(CFG["micro_bs"]), y.split(CFG["micro_bs"])))


class Trainer:
    def __init__(self, rank, world):
        self.rank, self.world = rank, world
        torch.manual_seed(0)
        self.model = DDP(Tagger(CFG["vocab"], CFG["tags"], CFG["dim"]), gradient_as_bucket_view=True)
        self.model.register_comm_hook(dist.group.WORLD, default_hooks.allreduce_hook)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=CFG["lr"], momentum=0.9)
        self.crit = nn.CrossEntropyLoss(ignore_index=PAD)
        self.K = CFG["accum"]

    def micro_step(self, x, y, k, n_window):
        ctx = self.model.no_sync() if k < self.K - 1 else contextlib.nullcontext()
        with ctx:
            logits = self.model(x)
            loss = self.crit(logits.reshape(-1, CFG["tags"]), y.reshape(-1)) / self.K
            loss.backward()
        return loss.detach()

    def window_count(self, window):
        n = torch.tensor(float(sum(int((y != PAD).sum()) for _, y in window)))
        dist.all_reduce(n)
        return n

    def fit(self, data):
        for step in range(CFG["steps"]):
            window = data[step * self.K:(step + 1) * self.K]
            n_window = self.window_count(window)
            tot = sum(self.micro_step(x, y, k, n_window) for k, (x, y) in enumerate(window))
            self.opt.step()
            self.opt.zero_grad(set_to_none=True)
            if self.rank == 0:
                print(f"step {step} loss {tot.item():.4f} tokens {int(n_window)}", flush=True)


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.use_deterministic_algorithms(True)
    tr = Trainer(rank, world)
    tr.fit(shard(rank, world))
    fulls = list(tr.model.module.named_parameters())
    if rank == 0:
        h = hashlib.sha256()
        for _, t in fulls:
            h.update(t.detach().float().contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
