"""DDP with a static graph, ranks of different micro-batch sizes and a short last window.

* rank r reads micro-batches of 5 - 2r samples (5 and 3): the ranks hold
  different sample counts, so each window's loss is the sum of per-sample
  losses over the window's sample count on all ranks, times W (DDP averages);
* 7 micro-batches per rank and epoch at K = 3: windows 3, 3, 1;
* a frozen feature table and a legacy head kept for checkpoint compatibility
  (never used in forward, hence find_unused_parameters);
* gradient clipping at 1.0 on the accumulated, averaged gradient.
"""
import argparse
import hashlib

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP


class Model(nn.Module):
    def __init__(self, n_feat=30, d=24, n_out=3):
        super().__init__()
        self.table = nn.Embedding(n_feat, d)
        self.table.weight.requires_grad_(False)
        self.mix = nn.Sequential(nn.Linear(d, d), nn.SiLU(), nn.Linear(d, d), nn.SiLU())
        self.head = nn.Linear(d, n_out)
        self.legacy_head = nn.Linear(d, n_out)  # old checkpoints have it; unused

    def forward(self, feats):
        return self.head(self.mix(self.table(feats).mean(1)))


def epoch_batches(rank, epoch, n_micro=7):
    g = torch.Generator().manual_seed(500 + 10 * epoch + rank)
    bs = 5 - 2 * rank
    out = []
    for _ in range(n_micro):
        f = torch.randint(0, 30, (bs, 6), generator=g)
        y = (f % 3).sum(1) % 3
        out.append((f, y))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--accum", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--clip", type=float, default=1.0)
    args = ap.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = DDP(Model(), find_unused_parameters=True)
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.3, momentum=0.9)

    for epoch in range(args.epochs):
        batches = epoch_batches(rank, epoch)
        for start in range(0, len(batches), args.accum):
            window = batches[start:start + args.accum]
            n = torch.tensor(float(sum(len(y) for _, y in window)))
            dist.all_reduce(n)
            for j, (f, y) in enumerate(window):
                last = j == len(window) - 1
                if last:
                    loss = F.cross_entropy(model(f), y, reduction="sum") * world / n
                    loss.backward()
                else:
                    with model.no_sync():
                        loss = F.cross_entropy(model(f), y, reduction="sum") * world / n
                        loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
            opt.step()
            opt.zero_grad(set_to_none=True)

    if rank == 0:
        h = hashlib.sha256()
        for _, p in model.module.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
