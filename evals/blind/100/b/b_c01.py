"""HSDP (fully_shard on a 2-D replicate x shard mesh) with reduce-scatter on
every micro-batch and the cross-replica all-reduce only on the last one.

The position table is frozen; gradients are clipped (max-norm 0.5) on the
sharded DTensor gradients before each AdamW step.
"""
import hashlib

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

VOCAB, DIM, SEQ, MB, K, WINDOWS, LR, CLIP, SEED = 80, 32, 12, 3, 4, 6, 3e-3, 0.5, 21


class Layer(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.up = nn.Linear(d, 3 * d)
        self.down = nn.Linear(3 * d, d)

    def forward(self, x):
        return x + self.down(F.silu(self.up(self.norm(x))))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.pos = nn.Parameter(torch.randn(SEQ, DIM) * 0.02, requires_grad=False)
        self.layers = nn.ModuleList([Layer(DIM) for _ in range(3)])
        self.out = nn.Linear(DIM, VOCAB)

    def forward(self, ids):
        h = self.embed(ids) + self.pos
        for layer in self.layers:
            h = layer(h)
        return self.out(h)


def build_model():
    torch.manual_seed(SEED)
    return Net()


def rank_batches(rank):
    g = torch.Generator().manual_seed(500 + rank)
    ids = torch.randint(0, VOCAB, (WINDOWS * K, MB, SEQ + 1), generator=g)
    ids[..., 1:] = (ids[..., :-1] * 3 + 1) % VOCAB
    return [(b[:, :-1], b[:, 1:]) for b in ids]


def loss_fn(model, x, y):
    logits = model(x)
    return F.cross_entropy(logits.reshape(-1, VOCAB), y.reshape(-1))


def make_opt(model):
    return torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=LR, weight_decay=0.1)


def report(named_params):
    h = hashlib.sha256()
    for _, p in named_params:
        h.update(p.detach().float().contiguous().cpu().numpy().tobytes())
    print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.use_deterministic_algorithms(True)
    mesh = init_device_mesh("cpu", (world, 1), mesh_dim_names=("replicate", "shard"))
    model = build_model()
    for layer in model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = make_opt(model)

    batches = rank_batches(rank)
    for w in range(WINDOWS):
        for k in range(K):
            # reduce-scatter each micro-batch inside the shard group, all-reduce
            # across replicas once per window
            model.set_requires_all_reduce(k == K - 1)
            x, y = batches[w * K + k]
            (loss_fn(model, x, y) / K).backward()
        torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], CLIP)
        opt.step()
        opt.zero_grad()

    full = [(n, p.full_tensor()) for n, p in model.named_parameters()]
    if rank == 0:
        report(full)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
