"""Two-tower DDP recommender with an fp32 summing comm hook, two optimizers and a restore.

The sparse item embedding has its own SGD optimizer, the dense towers AdamW; the user-id
hash table is frozen. Micro-batches have different sizes on each rank; each window's
loss is the sample sum over the window's sample count across all ranks, and the comm hook
sums (no division by the world size), so the update is the window's per-sample mean.
Mid-run the state is written to disk at a step boundary and the run continues in rebuilt
DDP modules, optimizers and schedulers.
"""
import hashlib
import os
import tempfile
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


@dataclass
class Cfg:
    n_users: int = 30
    n_items: int = 60
    d: int = 16
    accum: int = 3
    steps: int = 9
    restore_at: int = 4
    seed: int = 21


def fp32_sum_hook(state, bucket):
    buf = bucket.buffer()
    t = buf.to(torch.float32)
    work = dist.all_reduce(t, async_op=True)

    def done(fut):
        buf.copy_(t)
        return buf
    return work.get_future().then(done)


class TwoTower(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.user_hash = nn.Embedding(c.n_users, c.d)
        self.user_hash.weight.requires_grad_(False)
        self.item = nn.Embedding(c.n_items, c.d)
        self.u_tower = nn.Sequential(nn.Linear(c.d, 32), nn.ReLU(), nn.Linear(32, c.d))
        self.i_tower = nn.Sequential(nn.Linear(c.d, 32), nn.ReLU(), nn.Linear(32, c.d))

    def forward(self, u, i):
        return (self.u_tower(self.user_hash(u)) * self.i_tower(self.item(i))).sum(-1)


def build(c):
    torch.manual_seed(c.seed)
    model = DDP(TwoTower(c))
    model.register_comm_hook(None, fp32_sum_hook)
    emb_params = [model.module.item.weight]
    dense = [p for n, p in model.module.named_parameters() if p.requires_grad and not n.startswith("item.")]
    opt_sparse = torch.optim.SGD(emb_params, lr=0.5, momentum=0.5)
    opt_dense = torch.optim.AdamW(dense, lr=5e-3)
    sch_dense = torch.optim.lr_scheduler.CosineAnnealingLR(opt_dense, T_max=c.steps)
    return model, [opt_sparse, opt_dense], sch_dense


def data(c, rank):
    g = torch.Generator().manual_seed(c.seed * 7 + rank)
    out = []
    for m in range(c.steps * c.accum):
        bs = int(torch.randint(2, 9, (1,), generator=g))
        u = torch.randint(0, c.n_users, (bs,), generator=g)
        i = torch.randint(0, c.n_items, (bs,), generator=g)
        y = ((u + i) % 3 == 0).float()
        out.append((u, i, y))
    return out


def train_steps(c, model, opts, sched, batches, start, stop):
    for step in range(start, stop):
        window = batches[step * c.accum:(step + 1) * c.accum]
        n = torch.tensor(float(sum(len(y) for _, _, y in window)))
        dist.all_reduce(n)
        for j, (u, i, y) in enumerate(window):
            model.require_backward_grad_sync = j == c.accum - 1
            loss = F.binary_cross_entropy_with_logits(model(u, i), y, reduction="sum") / n
            loss.backward()
        for o in opts:
            o.step()
        sched.step()
        for o in opts:
            o.zero_grad(set_to_none=True)


def main():
    c = Cfg()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    batches = data(c, rank)
    model, opts, sched = build(c)
    train_steps(c, model, opts, sched, batches, 0, c.restore_at)

    path = [os.path.join(tempfile.mkdtemp(prefix="c03_"), "state.pt") if rank == 0 else None]
    dist.broadcast_object_list(path, src=0)
    if rank == 0:
        torch.save({"model": model.module.state_dict(), "opts": [o.state_dict() for o in opts],
                    "sched": sched.state_dict(), "step": c.restore_at}, path[0])
    dist.barrier()
    del model, opts, sched

    model, opts, sched = build(c)
    state = torch.load(path[0])
    model.module.load_state_dict(state["model"])
    for o, s in zip(opts, state["opts"]):
        o.load_state_dict(s)
    sched.load_state_dict(state["sched"])
    train_steps(c, model, opts, sched, batches, state["step"], c.steps)

    flat = torch.cat([p.detach().float().reshape(-1) for _, p in model.module.named_parameters()])
    if rank == 0:
        print("FINAL_SHA256", hashlib.sha256(flat.numpy().tobytes()).hexdigest())
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
