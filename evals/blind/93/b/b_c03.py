"""DDP with gradient_as_bucket_view, a summing fp32 comm hook, no_sync accumulation, two optimizers
and a restart from a checkpoint into rebuilt objects.

Some labels are masked (-1), so the loss of a window is the cross-entropy sum over the
window's labelled samples on all ranks, divided by that all-ranks count; the comm hook
sums (no / W), so the result is the large-batch mean directly.
"""
import hashlib
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

K, MB, UPDATES, RESUME_AT, SEED = 2, 6, 8, 3, 5
CKPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tmp_scratch", "c03_ckpt.pt")


def sum_hook(state, bucket):
    fut = dist.all_reduce(bucket.buffer(), async_op=True).get_future()
    return fut.then(lambda f: f.value()[0])


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(12, 32), nn.SiLU(), nn.Linear(32, 32), nn.SiLU())
        self.head = nn.Linear(32, 4)

    def forward(self, x):
        return self.head(self.body(x))


class Job:
    def __init__(self, rank, world):
        self.rank, self.world = rank, world
        torch.manual_seed(SEED)
        net = Model()
        self.ddp = DDP(net, gradient_as_bucket_view=True)
        self.ddp.register_comm_hook(None, sum_hook)
        self.opt_body = torch.optim.AdamW(net.body.parameters(), lr=3e-3, weight_decay=0.01)
        self.opt_head = torch.optim.SGD(net.head.parameters(), lr=5e-2, momentum=0.9)
        self.update = 0

    def state(self):
        return {"model": self.ddp.module.state_dict(), "body": self.opt_body.state_dict(),
                "head": self.opt_head.state_dict(), "update": self.update}

    def load(self, sd):
        self.ddp.module.load_state_dict(sd["model"])
        self.opt_body.load_state_dict(sd["body"])
        self.opt_head.load_state_dict(sd["head"])
        self.update = sd["update"]

    def window(self, u):
        g = torch.Generator().manual_seed(SEED * 1000 + u * 10 + self.rank)
        out = []
        for _ in range(K):
            x = torch.randn(MB, 12, generator=g)
            y = (x[:, :4].argmax(1))
            y[torch.rand(MB, generator=g) < 0.35] = -1
            out.append((x, y))
        return out

    def train_until(self, stop):
        while self.update < stop:
            win = self.window(self.update)
            n = torch.tensor(float(sum((y >= 0).sum() for _, y in win)))
            dist.all_reduce(n)
            for j, (x, y) in enumerate(win):
                if j < K - 1:
                    with self.ddp.no_sync():
                        F.cross_entropy(self.ddp(x), y, ignore_index=-1, reduction="sum").div(n).backward()
                else:
                    F.cross_entropy(self.ddp(x), y, ignore_index=-1, reduction="sum").div(n).backward()
            for o in (self.opt_body, self.opt_head):
                o.step()
                o.zero_grad(set_to_none=True)
            self.update += 1


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    job = Job(rank, world)
    job.train_until(RESUME_AT)
    if rank == 0:
        torch.save(job.state(), CKPT)
    dist.barrier()
    del job

    job = Job(rank, world)
    job.load(torch.load(CKPT, weights_only=False))
    job.train_until(UPDATES)

    params = [(n, p.detach()) for n, p in job.ddp.module.named_parameters()]
    if rank == 0:
        if os.environ.get("PARAM_DUMP"):
            torch.save(dict(params), os.environ["PARAM_DUMP"])
        h = hashlib.sha256()
        for _, t in params:
            h.update(t.float().contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
