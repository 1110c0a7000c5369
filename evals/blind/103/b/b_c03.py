"""DDP (gradient-as-bucket-view) with two optimizers, a frozen feature
extractor, a warm-up LambdaLR per optimizer, a worker DataLoader over a DistributedSampler,
and a stop/restore into rebuilt objects at an optimizer-step boundary.
"""
import hashlib
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, DistributedSampler

ACCUM = 3
MICRO_BSZ = 5
TOTAL_STEPS = 9
STOP_AT = 4
WARMUP = 3
CKPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tmp_scratch", "b_c03_state.pt")


class Ratings(Dataset):
    def __init__(self, n=2 * MICRO_BSZ * ACCUM * TOTAL_STEPS):
        g = torch.Generator().manual_seed(5)
        self.user = torch.randint(0, 40, (n,), generator=g)
        self.item = torch.randint(0, 60, (n,), generator=g)
        self.feat = torch.randn(n, 8, generator=g)
        self.y = ((self.user % 7 - self.item % 5).float() / 3 + self.feat[:, 0]).tanh()

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return self.user[i], self.item[i], self.feat[i], self.y[i]


class Recommender(nn.Module):
    def __init__(self):
        super().__init__()
        self.users = nn.Embedding(40, 16)
        self.items = nn.Embedding(60, 16)
        self.featurizer = nn.Linear(8, 16)          # pretrained, frozen
        self.head = nn.Sequential(nn.Linear(48, 32), nn.ReLU(), nn.Linear(32, 1))

    def forward(self, u, i, f):
        z = torch.cat([self.users(u), self.items(i), self.featurizer(f)], -1)
        return self.head(z).squeeze(-1)


def params_sha(model):
    h = hashlib.sha256()
    for _, p in model.named_parameters():
        h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def build():
    torch.manual_seed(123)
    net = Recommender()
    net.featurizer.requires_grad_(False)
    ddp = DDP(net, gradient_as_bucket_view=True)
    emb_params = [p for n, p in net.named_parameters() if n.startswith(("users", "items"))]
    head_params = list(net.head.parameters())
    opt_emb = torch.optim.SGD(emb_params, lr=0.5, momentum=0.9)
    opt_head = torch.optim.AdamW(head_params, lr=3e-3)
    warm = lambda s: min(1.0, (s + 1) / WARMUP)
    scheds = [torch.optim.lr_scheduler.LambdaLR(o, warm) for o in (opt_emb, opt_head)]
    return ddp, [opt_emb, opt_head], scheds


def micro_batches(rank, world, start_step):
    ds = Ratings()
    sampler = DistributedSampler(ds, num_replicas=world, rank=rank, shuffle=True, seed=9, drop_last=True)
    sampler.set_epoch(0)
    loader = DataLoader(ds, batch_size=MICRO_BSZ, sampler=sampler, num_workers=1,
                        persistent_workers=False)
    for idx, batch in enumerate(loader):
        if idx >= start_step * ACCUM:
            yield batch


def train(ddp, opts, scheds, rank, world, start, stop):
    micro = 0
    for u, i, f, y in micro_batches(rank, world, start):
        step = start + micro // ACCUM
        if step >= stop:
            break
        boundary = (micro + 1) % ACCUM == 0
        if boundary:
            loss = F.mse_loss(ddp(u, i, f), y) / ACCUM
            loss.backward()
        else:
            with ddp.no_sync():
                loss = F.mse_loss(ddp(u, i, f), y) / ACCUM
                loss.backward()
        micro += 1
        if boundary:
            for o in opts:
                o.step()
            for s in scheds:
                s.step()
            for o in opts:
                o.zero_grad(set_to_none=True)


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()

    ddp, opts, scheds = build()
    train(ddp, opts, scheds, rank, world, 0, STOP_AT)
    if rank == 0:
        torch.save({"model": ddp.module.state_dict(),
                    "opts": [o.state_dict() for o in opts],
                    "scheds": [s.state_dict() for s in scheds],
                    "step": STOP_AT}, CKPT)
    dist.barrier()
    del ddp, opts, scheds

    ddp, opts, scheds = build()
    state = torch.load(CKPT, weights_only=False)
    ddp.module.load_state_dict(state["model"])
    for o, sd in zip(opts, state["opts"]):
        o.load_state_dict(sd)
    for s, sd in zip(scheds, state["scheds"]):
        s.load_state_dict(sd)
    train(ddp, opts, scheds, rank, world, state["step"], TOTAL_STEPS)

    sha = params_sha(ddp.module)
    if rank == 0:
        print(f"FINAL_SHA256 {sha}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
