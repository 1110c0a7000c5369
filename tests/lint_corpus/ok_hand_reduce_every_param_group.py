# corpus: style=spawn class=OK
"""A small classifier on spawned ranks: AdamW with a no-decay group, gradients averaged by hand
once per window (K micro-batches)."""
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

ACCUM = 4


def build_optimizer(model, lr=1e-3, wd=0.1):
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": wd},
                              {"params": no_decay, "weight_decay": 0.0}], lr=lr)


def sync_grads(opt, world):
    for param in (p for g in opt.param_groups for p in g["params"]):
        dist.all_reduce(param.grad)
        param.grad /= world


def worker(rank, world):
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:29611", rank=rank,
                            world_size=world)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.LayerNorm(32),
                                torch.nn.Linear(32, 4))
    opt = build_optimizer(model)
    for it in range(40):
        x, y = torch.randn(8, 16), torch.randint(0, 4, (8,))
        (F.cross_entropy(model(x), y) / ACCUM).backward()
        if (it + 1) % ACCUM == 0:
            sync_grads(opt, world)
            opt.step()
            opt.zero_grad(set_to_none=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(worker, args=(2,), nprocs=2)
