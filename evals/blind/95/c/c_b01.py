"""SimCLR-style contrastive pretraining, data parallel by hand (no DDP wrapper).

Each rank accumulates K micro-batches, then one flat all-reduce averages the
gradients across ranks before the optimizer step.
"""
import os
import hashlib
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.distributed as dist
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

ACCUM = 4
MICRO_BS = 8
STEPS = 12
LR = 2e-3
TAU = 0.2


class Encoder(nn.Module):
    def __init__(self, d_in=32, d_hid=64, d_out=16):
        super().__init__()
        self.backbone = nn.Sequential(nn.Linear(d_in, d_hid), nn.ReLU(), nn.Linear(d_hid, d_hid), nn.ReLU())
        self.proj = nn.Sequential(nn.Linear(d_hid, d_hid), nn.ReLU(), nn.Linear(d_hid, d_out))

    def forward(self, x):
        return F.normalize(self.proj(self.backbone(x)), dim=-1)


def nt_xent(z1, z2, tau):
    n = z1.size(0)
    z = torch.cat([z1, z2])
    sim = z @ z.t() / tau
    sim.fill_diagonal_(float("-inf"))
    targets = torch.cat([torch.arange(n, 2 * n), torch.arange(0, n)])
    return F.cross_entropy(sim, targets)


def augment(x, g):
    return x * (1 + 0.1 * torch.randn(x.shape, generator=g)) + 0.05 * torch.randn(x.shape, generator=g)


def sync_gradients(params, world_size):
    grads = [p.grad for p in params if p.grad is not None]
    flat = _flatten_dense_tensors(grads)
    dist.all_reduce(flat)
    flat.div_(world_size)
    for g, synced in zip(grads, _unflatten_dense_tensors(flat, grads)):
        g = synced


def param_digest(model):
    h = hashlib.sha256()
    for _, p in model.named_parameters():
        h.update(p.detach().float().contiguous().numpy().tobytes())
    return h.hexdigest()


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = Encoder()
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.01)
    params = list(model.parameters())

    g = torch.Generator().manual_seed(1000 + rank)
    protos = torch.randn(10, 32, generator=torch.Generator().manual_seed(7))
    for step in range(STEPS):
        opt.zero_grad(set_to_none=True)
        for micro in range(ACCUM):
            idx = torch.randint(0, 10, (MICRO_BS,), generator=g)
            x = protos[idx] + 0.3 * torch.randn(MICRO_BS, 32, generator=g)
            loss = nt_xent(model(augment(x, g)), model(augment(x, g)), TAU) / ACCUM
            loss.backward()
        sync_gradients(params, world)
        opt.step()
        if rank == 0 and step % 4 == 0:
            print(f"step {step} loss {loss.item() * ACCUM:.4f}", flush=True)

    if os.environ.get("PARAM_DUMP") and rank == 0:
        torch.save(torch.cat([p.detach().flatten() for p in model.parameters()]), os.environ["PARAM_DUMP"])
    digest = param_digest(model)
    if rank == 0:
        print(f"FINAL_SHA256 {digest}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
