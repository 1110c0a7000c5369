# Residual MLP regressor sharded with FSDP2 (fully_shard) on 2 CPU ranks.
# torchrun-launched, nanoGPT-style globals. Gradient accumulation keeps the
# reduce-scatter off until the last micro-step of each window.
import hashlib

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

# -----------------------------------------------------------------------------
in_dim = 20
width = 48
n_blocks = 3
out_dim = 4
micro_batch = 6
gradient_accumulation_steps = 3
epochs = 4
learning_rate = 1e-2
n_samples = 132
seed = 2024
# -----------------------------------------------------------------------------


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.ln = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 2 * d)
        self.fc2 = nn.Linear(2 * d, d)

    def forward(self, x):
        return x + self.fc2(F.silu(self.fc1(self.ln(x))))


class Regressor(nn.Module):
    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(in_dim, width)
        self.blocks = nn.ModuleList([Block(width) for _ in range(n_blocks)])
        self.out = nn.Linear(width, out_dim)

    def forward(self, x):
        h = self.inp(x)
        for blk in self.blocks:
            h = blk(h)
        return self.out(h)


def make_dataset():
    g = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(n_samples, in_dim, generator=g)
    w = torch.randn(in_dim, out_dim, generator=g) / in_dim ** 0.5
    y = torch.tanh(x @ w) + 0.05 * torch.randn(n_samples, out_dim, generator=g)
    return TensorDataset(x, y)


def digest(model):
    h = hashlib.sha256()
    for _, p in model.named_parameters():
        t = p.full_tensor() if isinstance(p, DTensor) else p
        h.update(t.detach().float().contiguous().numpy().tobytes())
    return h.hexdigest()


dist.init_process_group("gloo")
rank = dist.get_rank()
world_size = dist.get_world_size()
mesh = init_device_mesh("cpu", (world_size,))
torch.manual_seed(seed)

model = Regressor()
for blk in model.blocks:
    fully_shard(blk, mesh=mesh)
fully_shard(model, mesh=mesh)
optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate, weight_decay=0.0)

dataset = make_dataset()
sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=True, seed=seed)
loader = DataLoader(dataset, batch_size=micro_batch, sampler=sampler)

updates = 0
for epoch in range(epochs):
    sampler.set_epoch(epoch)
    # only whole windows are run
    usable = len(loader) // gradient_accumulation_steps * gradient_accumulation_steps
    for micro_step, (x, y) in enumerate(loader):
        if micro_step >= usable:
            break
        last_micro = (micro_step + 1) % gradient_accumulation_steps == 0
        model.set_requires_gradient_sync(last_micro)
        loss = F.mse_loss(model(x), y) / gradient_accumulation_steps
        loss.backward()
        if last_micro:
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            updates += 1
    # the epoch's trailing micro-batches never fill a window: throw their
    # partial gradients away instead of stepping on a short window
    optimizer.zero_grad(set_to_none=True)
    if rank == 0:
        print(f"epoch {epoch} loss {loss.item() * gradient_accumulation_steps:.4f} updates {updates}")

final = digest(model)
if rank == 0:
    print(f"FINAL_SHA256 {final}")
dist.barrier()
dist.destroy_process_group()
