"""Small sequence classifier on DDP (gloo, bucket views) with gradient accumulation.

Launch: torchrun --nproc-per-node 2 ... b_b03.py
"""
import contextlib
import hashlib
import os
from types import SimpleNamespace

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

CONFIG = SimpleNamespace(
    vocab=50, seq_len=10, d=32, n_cls=4,
    micro_bs=8, accum_steps=4, updates=10,
    lr=0.05, momentum=0.9, seed=2024,
)


class ConvClassifier(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.emb = nn.Embedding(c.vocab, c.d)
        self.conv = nn.Conv1d(c.d, c.d, kernel_size=3, padding=1)
        self.head = nn.Linear(c.d, c.n_cls)

    def forward(self, tok):
        h = self.emb(tok).transpose(1, 2)
        h = F.relu(self.conv(h)).mean(-1)
        return self.head(h)


class DDPRunner:
    def __init__(self, c):
        self.c = c
        dist.init_process_group("gloo")
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        torch.manual_seed(c.seed)
        net = ConvClassifier(c)
        self.model = DDP(net, gradient_as_bucket_view=True)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=c.lr, momentum=c.momentum)
        # DDP already averages the gradients over the ranks; only the
        # accumulation window needs folding into the loss scale
        self.loss_scale = 1.0 / c.accum_steps

    def data(self):
        c = self.c
        g = torch.Generator().manual_seed(c.seed + 99)
        n_micro = c.updates * c.accum_steps
        toks = torch.randint(0, c.vocab, (n_micro, self.world, c.micro_bs, c.seq_len), generator=g)
        labels = (toks[..., :3].sum(-1) % c.n_cls)
        return [(toks[i, self.rank], labels[i, self.rank]) for i in range(n_micro)]

    def micro_step(self, tok, lab, sync):
        ctx = contextlib.nullcontext() if sync else self.model.no_sync()
        with ctx:
            loss = F.cross_entropy(self.model(tok), lab) * self.loss_scale
            loss.backward()
        return loss.detach()

    def fit(self):
        batches = self.data()
        K = self.c.accum_steps
        for i, (tok, lab) in enumerate(batches):
            last = (i + 1) % K == 0
            self.micro_step(tok, lab, sync=last)
            if last:
                self.opt.step()
                self.opt.zero_grad(set_to_none=True)

    def sha(self):
        h = hashlib.sha256()
        for _, p in self.model.module.named_parameters():
            h.update(p.detach().float().contiguous().cpu().numpy().tobytes())
        return h.hexdigest()


def main():
    r = DDPRunner(CONFIG)
    r.fit()
    digest = r.sha()
    if r.rank == 0:
        print(f"FINAL_SHA256 {digest}")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
