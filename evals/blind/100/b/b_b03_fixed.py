"""DDP regression trainer that groups micro-batches into accumulation windows.

Windows are built by chunking the epoch's micro-batches into groups of
`accum_steps`; all but the last backward of a window run under `no_sync()`.
"""
import argparse
import hashlib
from contextlib import nullcontext
from itertools import islice

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def chunked(iterable, n):
    it = iter(iterable)
    while chunk := list(islice(it, n)):
        yield chunk


class Regressor(nn.Module):
    def __init__(self, d_in=20, d_hidden=64):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(d_in, d_hidden), nn.Tanh(),
                                 nn.Linear(d_hidden, d_hidden), nn.Tanh(),
                                 nn.Linear(d_hidden, 1))

    def forward(self, x):
        return self.net(x).squeeze(-1)


class Trainer:
    def __init__(self, args, rank, world):
        self.args = args
        torch.manual_seed(args.seed)
        self.model = DDP(Regressor(), gradient_as_bucket_view=True)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=args.lr, momentum=0.9)
        g = torch.Generator().manual_seed(args.seed + 1)
        x = torch.randn(args.n_samples, 20, generator=g)
        y = torch.sin(x[:, :5].sum(-1)) + 0.1 * torch.randn(args.n_samples, generator=g)
        ds = TensorDataset(x, y)
        self.sampler = DistributedSampler(ds, num_replicas=world, rank=rank, shuffle=True, seed=args.seed)
        self.loader = DataLoader(ds, batch_size=args.micro_bs, sampler=self.sampler)
        self.loss_fn = nn.MSELoss()

    def micro_step(self, xb, yb, sync, n_micro):
        ctx = nullcontext() if sync else self.model.no_sync()
        with ctx:
            loss = self.loss_fn(self.model(xb), yb) / n_micro
            loss.backward()
        return loss.detach()

    def train_window(self, window):
        for j, (xb, yb) in enumerate(window):
            self.micro_step(xb, yb, sync=(j == len(window) - 1), n_micro=len(window))
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)

    def fit(self):
        for epoch in range(self.args.epochs):
            self.sampler.set_epoch(epoch)
            for window in chunked(self.loader, self.args.accum_steps):
                self.train_window(window)


def report(named_params):
    h = hashlib.sha256()
    for _, p in named_params:
        h.update(p.detach().float().contiguous().cpu().numpy().tobytes())
    print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--n-samples", type=int, default=120)   # 60 per rank -> 10 micro-batches
    p.add_argument("--micro-bs", type=int, default=6)
    p.add_argument("--accum-steps", type=int, default=4)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=11)
    args = p.parse_args()
    dist.init_process_group("gloo")
    torch.use_deterministic_algorithms(True)
    tr = Trainer(args, dist.get_rank(), dist.get_world_size())
    tr.fit()
    if dist.get_rank() == 0:
        report(tr.model.module.named_parameters())
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
