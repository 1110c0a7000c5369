"""FSDP2 on two spawned ranks: epochs of 7 micro-batches with K = 3 (windows 3-3-1), each window
normalised by its real length, a clip on the sharded gradients, bf16 parameters with fp32 reduction."""
import hashlib
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

PORT = 49141
K = 3
EPOCHS = 3
BATCHES_PER_EPOCH = 7
MICRO = 6


def make_model():
    torch.manual_seed(5)
    return nn.Sequential(
        nn.Linear(16, 48), nn.GELU(),
        nn.Sequential(nn.Linear(48, 48), nn.GELU()),
        nn.Sequential(nn.Linear(48, 48), nn.GELU()),
        nn.Linear(48, 3),
    )


def shard_batches(epoch, rank):
    g = torch.Generator().manual_seed(97 * epoch + rank)
    xs = torch.randn(BATCHES_PER_EPOCH, MICRO, 16, generator=g)
    ys = torch.randint(0, 3, (BATCHES_PER_EPOCH, MICRO), generator=g)
    return list(zip(xs, ys))


def worker(rank, world):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(PORT))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.use_deterministic_algorithms(True)
    model = make_model()
    mesh = init_device_mesh("cpu", (world,))
    mp_policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for sub in (model[2], model[3]):
        fully_shard(sub, mesh=mesh, mp_policy=mp_policy)
    fully_shard(model, mesh=mesh, mp_policy=mp_policy)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)

    n_steps = 0
    for epoch in range(EPOCHS):
        batches = shard_batches(epoch, rank)
        windows = [batches[i:i + K] for i in range(0, len(batches), K)]
        for window in windows:
            for j, (x, y) in enumerate(window):
                model.set_requires_gradient_sync(j == len(window) - 1)
                logits = model(x)
                loss = F.cross_entropy(logits.float(), y) / len(window)
                loss.backward()
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=0.25)
            opt.step()
            opt.zero_grad()
            n_steps += 1
        if rank == 0:
            print(f"epoch {epoch} steps {n_steps} grad_norm {norm.full_tensor().item() if isinstance(norm, DTensor) else norm.item():.4f}")

    h = hashlib.sha256()
    for _, p in model.named_parameters():
        t = p.full_tensor() if isinstance(p, DTensor) else p
        h.update(t.detach().float().contiguous().numpy().tobytes())
    if rank == 0:
        print("FINAL_SHA256", h.hexdigest())
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(worker, args=(2,), nprocs=2, join=True)
