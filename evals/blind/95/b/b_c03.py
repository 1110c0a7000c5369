"""DDP + ZeroRedundancyOptimizer with an fp32 all-reduce comm hook, no_sync accumulation (K=2),
a frozen embedding table, uneven micro-batch sizes normalised by the window's all-ranks sample count."""
import hashlib
import torch, torch.nn as nn, torch.nn.functional as F
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

K, STEPS = 2, 10


class Rec(nn.Module):
    def __init__(self):
        super().__init__()
        self.user = nn.Embedding(50, 16)
        self.item = nn.Embedding(60, 16)
        self.mlp = nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 1))

    def forward(self, u, i):
        return self.mlp(torch.cat([self.user(u), self.item(i)], -1)).squeeze(-1)


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    net = Rec()
    net.item.weight.requires_grad_(False)
    model = DDP(net)
    model.register_comm_hook(dist.group.WORLD, default_hooks.allreduce_hook)
    opt = ZeroRedundancyOptimizer([p for p in model.parameters() if p.requires_grad],
                                  optimizer_class=torch.optim.Adam, lr=1e-2)
    g = torch.Generator().manual_seed(5 + rank)
    for step in range(STEPS):
        sizes = [3 + (step + j + 2 * rank) % 5 for j in range(K)]
        batch = [(torch.randint(0, 50, (n,), generator=g), torch.randint(0, 60, (n,), generator=g),
                  torch.rand(n, generator=g)) for n in sizes]
        total = torch.tensor(float(sum(sizes)))
        dist.all_reduce(total)
        for j, (u, i, r) in enumerate(batch):
            ctx = model.no_sync() if j < K - 1 else torch.enable_grad()
            with ctx:
                loss = F.mse_loss(model(u, i), r, reduction="sum") * world / total
                loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    params = [p.detach().float().reshape(-1) for _, p in model.module.named_parameters()]
    if rank == 0:
        flat = torch.cat(params)
        print("FINAL_SHA256", hashlib.sha256(flat.numpy().tobytes()).hexdigest(), flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
