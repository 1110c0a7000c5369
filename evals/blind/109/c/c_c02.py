"""Image classifier on 2 DDP ranks with BatchNorm, a frozen stem, two optimizers
(SGD-momentum for the trunk, AdamW for the head), each with its own schedule,
and a worker DataLoader. 10 micro-batches per rank per epoch with K = 4, so
windows are 4-4-2; each micro-batch's mean is divided by its window's length.
The run is interrupted after optimizer step 5 (mid-epoch, at a window boundary),
saved to disk, and resumed into freshly built objects."""
import argparse
import hashlib
import os
from contextlib import nullcontext

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, DistributedSampler

HERE = os.path.dirname(os.path.abspath(__file__))


class Shapes(Dataset):
    def __init__(self, n=160, seed=21):
        g = torch.Generator().manual_seed(seed)
        self.y = torch.randint(0, 4, (n,), generator=g)
        base = torch.randn(4, 3, 10, 10, generator=g)
        self.x = base[self.y] + torch.randn(n, 3, 10, 10, generator=g)

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        x = self.x[i]
        if i % 2:
            x = x.flip(-1)  # deterministic "augmentation"
        return x, self.y[i]


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU())
        self.trunk = nn.Sequential(nn.Conv2d(8, 16, 3, stride=2, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                                   nn.Conv2d(16, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU())
        self.head = nn.Linear(16, 4)

    def forward(self, x):
        return self.head(self.trunk(self.stem(x)).mean(dim=(2, 3)))


def build(args):
    torch.manual_seed(args.seed)
    net = Net()
    net.stem.requires_grad_(False)
    model = DDP(net)
    opt_trunk = torch.optim.SGD(net.trunk.parameters(), lr=0.05, momentum=0.9)
    opt_head = torch.optim.AdamW(net.head.parameters(), lr=2e-3)
    scheds = [torch.optim.lr_scheduler.StepLR(opt_trunk, step_size=3, gamma=0.7),
              torch.optim.lr_scheduler.LambdaLR(opt_head, lambda s: min(1.0, (s + 1) / 3))]
    return net, model, [opt_trunk, opt_head], scheds


def run(args, rank, world, stop_after=None, state=None):
    net, model, opts, scheds = build(args)
    ds = Shapes()
    sampler = DistributedSampler(ds, num_replicas=world, rank=rank, shuffle=True, seed=args.seed)
    loader = DataLoader(ds, batch_size=args.micro_batch, sampler=sampler, num_workers=2)
    n_micro = len(loader)
    windows = [list(range(s, min(s + args.accum, n_micro))) for s in range(0, n_micro, args.accum)]

    step, start_epoch, start_window = 0, 0, 0
    if state is not None:
        net.load_state_dict(state["model"])
        for o, s in zip(opts, state["opts"]):
            o.load_state_dict(s)
        for sc, s in zip(scheds, state["scheds"]):
            sc.load_state_dict(s)
        step, start_epoch, start_window = state["step"], state["epoch"], state["window"]

    for epoch in range(start_epoch, args.epochs):
        sampler.set_epoch(epoch)
        batches = list(loader)
        for w in range(start_window if epoch == start_epoch else 0, len(windows)):
            idx = windows[w]
            for j, b in enumerate(idx):
                x, y = batches[b]
                ctx = model.no_sync() if j < len(idx) - 1 else nullcontext()
                with ctx:
                    loss = F.cross_entropy(model(x), y) / len(idx)
                    loss.backward()
            for o in opts:
                o.step()
            for sc in scheds:
                sc.step()
            for o in opts:
                o.zero_grad(set_to_none=True)
            step += 1
            if stop_after is not None and step == stop_after:
                nxt_epoch, nxt_window = (epoch, w + 1) if w + 1 < len(windows) else (epoch + 1, 0)
                return {"model": net.state_dict(), "opts": [o.state_dict() for o in opts],
                        "scheds": [s.state_dict() for s in scheds],
                        "step": step, "epoch": nxt_epoch, "window": nxt_window}
    return net


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--accum", type=int, default=4)
    p.add_argument("--micro-batch", type=int, default=8)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--seed", type=int, default=2)
    p.add_argument("--interrupt-at", type=int, default=5)
    args = p.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.use_deterministic_algorithms(True)

    ckpt = os.path.join(HERE, "tmp_scratch", f"c_c02_rank{rank}.pt")
    os.makedirs(os.path.dirname(ckpt), exist_ok=True)
    state = run(args, rank, world, stop_after=args.interrupt_at)
    torch.save(state, ckpt)
    del state
    dist.barrier()
    state = torch.load(ckpt, weights_only=False)
    net = run(args, rank, world, state=state)

    if rank == 0:
        h = hashlib.sha256()
        for _, prm in net.named_parameters():
            h.update(prm.detach().float().contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
