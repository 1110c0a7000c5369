"""FSDP2 (fully_shard) MLP-mixer-ish regressor with the optimizer fused into backward.

Each parameter owns a tiny AdamW that steps from a post-accumulate-grad hook, so the
full gradient set never has to live in memory at once (the torchtune trick).
Launch: torchrun --nproc-per-node 2 ... b_b02.py
"""
import hashlib
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard


@dataclass
class Cfg:
    d_model: int = 32
    n_blocks: int = 3
    micro_bs: int = 6
    grad_accum: int = 3
    opt_steps: int = 10
    lr: float = 2e-3
    seed: int = 7


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 2 * d)
        self.fc2 = nn.Linear(2 * d, d)

    def forward(self, x):
        return x + self.fc2(F.gelu(self.fc1(self.norm(x))))


class Net(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.inp = nn.Linear(12, cfg.d_model)
        self.blocks = nn.ModuleList([Block(cfg.d_model) for _ in range(cfg.n_blocks)])
        self.out = nn.Linear(cfg.d_model, 1)

    def forward(self, x):
        h = self.inp(x)
        for b in self.blocks:
            h = b(h)
        return self.out(h).squeeze(-1)


def setup_optimizer_in_backward(model, lr):
    optims = {}
    for p in model.parameters():
        optims[p] = torch.optim.AdamW([p], lr=lr, weight_decay=0.0)

    def hook(param):
        optims[param].step()
        optims[param].zero_grad()

    for p in model.parameters():
        p.register_post_accumulate_grad_hook(hook)
    return optims


def main():
    cfg = Cfg()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,))
    torch.manual_seed(cfg.seed)
    model = Net(cfg)
    for blk in model.blocks:
        fully_shard(blk, mesh=mesh)
    fully_shard(model, mesh=mesh)
    setup_optimizer_in_backward(model, cfg.lr)

    g = torch.Generator().manual_seed(cfg.seed + 1)
    n_micro = cfg.opt_steps * cfg.grad_accum
    X = torch.randn(n_micro, world, cfg.micro_bs, 12, generator=g)
    w_true = torch.randn(12, generator=g)
    Y = torch.tanh(X @ w_true) + 0.1 * torch.randn(n_micro, world, cfg.micro_bs, generator=g)

    model.train()
    for it in range(n_micro):
        x, y = X[it, rank], Y[it, rank]
        loss = F.mse_loss(model(x), y) / cfg.grad_accum
        loss.backward()  # the hooks step once the reduced shard gradient lands

    h = hashlib.sha256()
    for _, p in model.named_parameters():
        full = p.full_tensor() if hasattr(p, "full_tensor") else p
        h.update(full.detach().float().contiguous().cpu().numpy().tobytes())
    if rank == 0:
        print(f"FINAL_SHA256 {h.hexdigest()}")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
