"""Tabular classifier: DDP + ZeroRedundancyOptimizer, an fp32 all-reduce comm
hook, a frozen input projection, a DataLoader worker and a short last window."""
import argparse
import hashlib
import itertools

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset, DistributedSampler


def build_dataset(n=200, d=12, seed=21):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g)
    w = torch.randn(d, 4, generator=g)
    y = (x @ w + 0.3 * torch.randn(n, 4, generator=g)).argmax(-1)
    return TensorDataset(x, y)


class MLP(nn.Module):
    def __init__(self, d=12, h=48, c=4):
        super().__init__()
        self.proj = nn.Linear(d, h)
        for p in self.proj.parameters():
            p.requires_grad_(False)
        self.body = nn.Sequential(nn.Tanh(), nn.Linear(h, h), nn.ReLU(), nn.Linear(h, c))

    def forward(self, x):
        return self.body(self.proj(x))


def chunks(it, k):
    it = iter(it)
    while True:
        w = list(itertools.islice(it, k))
        if not w:
            return
        yield w


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--accum", type=int, default=3)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--lr", type=float, default=5e-3)
    ap.add_argument("--max-norm", type=float, default=1.0)
    args = ap.parse_args()

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(3)
    ds = build_dataset()
    sampler = DistributedSampler(ds, shuffle=True, seed=4, drop_last=False)
    loader = DataLoader(ds, batch_size=args.batch, sampler=sampler, num_workers=1,
                        persistent_workers=False)

    model = DDP(MLP(), gradient_as_bucket_view=True)
    model.register_comm_hook(state=None, hook=default_hooks.allreduce_hook)
    opt = ZeroRedundancyOptimizer([p for p in model.parameters() if p.requires_grad],
                                  optimizer_class=torch.optim.AdamW, lr=args.lr, weight_decay=0.01)
    n_updates = -(-len(loader) // args.accum)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=n_updates)

    sampler.set_epoch(0)
    for u, window in enumerate(chunks(loader, args.accum)):
        for j, (x, y) in enumerate(window):
            last = j == len(window) - 1
            ctx = model.no_sync() if not last else torch.enable_grad()
            with ctx:
                loss = F.cross_entropy(model(x), y) / len(window)
                loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.max_norm)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        if rank == 0 and u % 3 == 0:
            print(f"update {u} window {len(window)} lr {sched.get_last_lr()[0]:.5f}", flush=True)

    h = hashlib.sha256()
    for _, p in model.module.named_parameters():
        h.update(p.detach().float().contiguous().numpy().tobytes())
    if rank == 0:
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
