"""Text classifier (bag-of-embeddings + MLP) on DDP with bucket-view gradients and an explicit
allreduce comm hook. Warm-up then cosine decay over the run's optimizer updates."""
import hashlib
import math
import os
from contextlib import nullcontext

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

CFG = dict(vocab=200, dim=32, classes=5, seq=16, micro_bs=8, accum=3,
           updates=10, warmup=3, lr=1e-2, seed=99)


class BagClassifier(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.emb = nn.EmbeddingBag(c["vocab"], c["dim"], mode="mean")
        self.mlp = nn.Sequential(nn.Linear(c["dim"], 64), nn.ReLU(), nn.Linear(64, c["classes"]))

    def forward(self, tokens):
        return self.mlp(self.emb(tokens))


def warmup_cosine(warmup, total):
    def f(step):
        if step < warmup:
            return (step + 1) / warmup
        prog = (step - warmup) / max(1, total - warmup)
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, prog)))
    return f


class DDPTrainer:
    def __init__(self, c):
        self.c = c
        dist.init_process_group("gloo")
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        torch.manual_seed(c["seed"])
        net = BagClassifier(c)
        self.model = DDP(net, gradient_as_bucket_view=True)
        self.model.register_comm_hook(None, default_hooks.allreduce_hook)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=c["lr"], momentum=0.9)
        self.sched = torch.optim.lr_scheduler.LambdaLR(
            self.opt, warmup_cosine(c["warmup"], c["updates"]))
        self.micro = 0

    def batches(self):
        g = torch.Generator().manual_seed(self.c["seed"] + 31 * self.rank)
        for _ in range(self.c["updates"] * self.c["accum"]):
            x = torch.randint(0, self.c["vocab"], (self.c["micro_bs"], self.c["seq"]), generator=g)
            y = (x[:, 0] % self.c["classes"])
            yield x, y

    def is_boundary(self):
        return (self.micro + 1) % self.c["accum"] == 0

    def forward_backward(self, x, y):
        ctx = nullcontext() if self.is_boundary() else self.model.no_sync()
        with ctx:
            loss = F.cross_entropy(self.model(x), y) / self.c["accum"]
            loss.backward()
        return loss.detach()

    def on_micro_end(self):
        self.sched.step()
        self.micro += 1

    def optimizer_step(self):
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)

    def fit(self):
        for x, y in self.batches():
            self.forward_backward(x, y)
            if self.is_boundary():
                self.optimizer_step()
            self.on_micro_end()

    def digest(self):
        h = hashlib.sha256()
        for _, p in self.model.module.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        return h.hexdigest()


if __name__ == "__main__":
    t = DDPTrainer(CFG)
    t.fit()
    d = t.digest()
    if t.rank == 0:
        print(f"FINAL_SHA256 {d}", flush=True)
    dist.barrier()
    dist.destroy_process_group()
