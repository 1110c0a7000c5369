# DDP with a worker DataLoader + DistributedSampler, bf16 autocast, a frozen input
# projection, OneCycleLR per optimizer step, and a checkpoint at an epoch boundary that is
# restored into a rebuilt model / optimizer / scheduler / loader for the second epoch.
import hashlib, os
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

ACCUM, MICRO, EPOCHS, N = 2, 4, 2, 96
CKPT = "/tmp/wb87_b_c03.pt"


def dataset():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(N, 12, generator=g)
    y = torch.sin(x[:, :3].sum(1, keepdim=True)) + 0.05 * torch.randn(N, 1, generator=g)
    return TensorDataset(x, y)


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(12, 32)
        self.proj.requires_grad_(False)
        self.net = nn.Sequential(nn.ReLU(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 1))

    def forward(self, x):
        return self.net(self.proj(x))


def build(world, steps_per_epoch):
    torch.manual_seed(0)
    model = DDP(Model())
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=1e-2, total_steps=EPOCHS * steps_per_epoch)
    return model, opt, sched


def loader(ds, epoch):
    sampler = DistributedSampler(ds, shuffle=True, seed=11)
    sampler.set_epoch(epoch)
    return DataLoader(ds, batch_size=MICRO, sampler=sampler, num_workers=1, drop_last=True)


def run_epoch(model, opt, sched, dl):
    it = list(dl)
    for i, (x, y) in enumerate(it):
        last = (i + 1) % ACCUM == 0
        ctx = model.no_sync() if not last else torch.enable_grad()
        with ctx:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                pred = model(x)
            loss = F.mse_loss(pred.float(), y) / ACCUM
            loss.backward()
        if last:
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    ds = dataset()
    steps_per_epoch = (N // world // MICRO) // ACCUM
    model, opt, sched = build(world, steps_per_epoch)
    run_epoch(model, opt, sched, loader(ds, 0))
    if rank == 0:
        torch.save({"model": model.module.state_dict(), "opt": opt.state_dict(),
                    "sched": sched.state_dict(), "epoch": 1}, CKPT)
    dist.barrier()
    del model, opt, sched

    model, opt, sched = build(world, steps_per_epoch)
    ck = torch.load(CKPT, weights_only=False)
    model.module.load_state_dict(ck["model"])
    opt.load_state_dict(ck["opt"])
    sched.load_state_dict(ck["sched"])
    for epoch in range(ck["epoch"], EPOCHS):
        run_epoch(model, opt, sched, loader(ds, epoch))

    buf = b"".join(p.detach().float().numpy().tobytes() for _, p in model.module.named_parameters())
    if rank == 0:
        print("FINAL_SHA256", hashlib.sha256(buf).hexdigest(), flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
