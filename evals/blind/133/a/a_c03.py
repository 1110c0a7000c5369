"""Two-optimizer DDP trainer (AdamW for the encoder, SGD for the head).

The epoch does not divide into whole windows: each window's loss is the mean
over the micro-batches it actually holds (4, 4, then 2), and DDP synchronises
only on the last micro-batch of each window.
"""
import argparse
import contextlib
import hashlib

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler


class SyntheticPairs(Dataset):
    def __init__(self, n=80, d=20, seed=11):
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, d, generator=g)
        proj = torch.randn(d, 1, generator=g)
        self.y = torch.tanh(self.x @ proj).squeeze(-1) + 0.1 * torch.randn(n, generator=g)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


class Regressor(nn.Module):
    def __init__(self, d=20, h=40):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(d, h), nn.SiLU(), nn.Linear(h, h), nn.SiLU())
        self.head = nn.Linear(h, 1)

    def forward(self, x):
        return self.head(self.encoder(x)).squeeze(-1)


class WindowedTrainer:
    def __init__(self, opts):
        self.opts = opts
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        torch.manual_seed(opts.seed)
        net = Regressor()
        self.ddp = DDP(net, gradient_as_bucket_view=True)
        self.optimizers = [
            torch.optim.AdamW(net.encoder.parameters(), lr=opts.lr_encoder, weight_decay=0.05),
            torch.optim.SGD(net.head.parameters(), lr=opts.lr_head, momentum=0.9),
        ]
        ds = SyntheticPairs(seed=opts.seed)
        self.sampler = DistributedSampler(ds, shuffle=True, seed=opts.seed)
        self.loader = DataLoader(ds, batch_size=opts.micro_batch, sampler=self.sampler, num_workers=1)

    def windows(self):
        buf = []
        for batch in self.loader:
            buf.append(batch)
            if len(buf) == self.opts.accum:
                yield buf
                buf = []
        if buf:
            yield buf

    def run_window(self, window):
        for j, (x, y) in enumerate(window):
            with contextlib.ExitStack() as stack:
                if j < len(window) - 1:
                    stack.enter_context(self.ddp.no_sync())
                pred = self.ddp(x)
                loss = F.mse_loss(pred, y) / len(window)
                loss.backward()
        for opt in self.optimizers:
            opt.step()
        for opt in self.optimizers:
            opt.zero_grad(set_to_none=True)
        return loss.item() * len(window)

    def fit(self):
        updates = 0
        for epoch in range(self.opts.epochs):
            self.sampler.set_epoch(epoch)
            for window in self.windows():
                last = self.run_window(window)
                updates += 1
            if self.rank == 0:
                print(f"epoch {epoch} updates {updates} last-loss {last:.4f}", flush=True)

    def sha(self):
        h = hashlib.sha256()
        for _, p in self.ddp.module.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        return h.hexdigest()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--micro-batch", type=int, default=4)
    ap.add_argument("--accum", type=int, default=4)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--lr-encoder", type=float, default=3e-3)
    ap.add_argument("--lr-head", type=float, default=0.05)
    ap.add_argument("--seed", type=int, default=5)
    opts = ap.parse_args()
    dist.init_process_group("gloo")
    torch.use_deterministic_algorithms(True)
    tr = WindowedTrainer(opts)
    tr.fit()
    digest = tr.sha()
    if tr.rank == 0:
        print(f"FINAL_SHA256 {digest}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
