"""DDP trainer class, interrupted after `stop_at` optimizer steps and resumed into new
objects. Rank r draws micro-batches of ROWS[r] rows (3 and 5); the loss of a window is
the mean over every row of the window on all ranks."""
import hashlib
import os
from contextlib import nullcontext

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset

ROWS = {0: 3, 1: 5}
K, TOTAL_STEPS, STOP_AT, SEED, D_IN = 3, 18, 8, 21, 12
CKPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ckpt_a_c03.pt")


class MicroBatches(Dataset):
    """Item i is the i-th micro-batch of this rank (a whole tensor batch)."""

    def __init__(self, rank, start, count):
        self.rank, self.start, self.count = rank, start, count

    def __len__(self):
        return self.count

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(SEED * 7919 + self.rank * 100003 + self.start + i)
        x = torch.randn(ROWS[self.rank], D_IN, generator=g)
        y = (x[:, :3].sum(-1, keepdim=True) > 0).float()
        return x, y


class Trainer:
    def __init__(self, rank, world):
        self.rank, self.world = rank, world
        torch.manual_seed(SEED)
        net = nn.Sequential(nn.Linear(D_IN, 32), nn.Tanh(), nn.Linear(32, 1))
        self.model = DDP(net, gradient_as_bucket_view=True)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=4e-3)
        self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, lambda s: min(1.0, (s + 1) / 5))
        self.step = 0

    def save(self):
        if self.rank == 0:
            torch.save({"model": self.model.module.state_dict(), "opt": self.opt.state_dict(),
                        "sched": self.sched.state_dict(), "step": self.step}, CKPT)
        dist.barrier()

    def load(self):
        ck = torch.load(CKPT, weights_only=False)
        self.model.module.load_state_dict(ck["model"])
        self.opt.load_state_dict(ck["opt"])
        self.sched.load_state_dict(ck["sched"])
        self.step = ck["step"]

    def window_rows(self, n_micro):
        t = torch.tensor([float(ROWS[self.rank] * n_micro)])
        dist.all_reduce(t)
        return t

    def train_until(self, last_step):
        n_micro = (last_step - self.step) * K
        loader = DataLoader(MicroBatches(self.rank, self.step * K, n_micro), batch_size=None,
                            num_workers=1, shuffle=False)
        rows = self.window_rows(K)
        for i, (x, y) in enumerate(loader):
            boundary = (i + 1) % K == 0
            with (nullcontext() if boundary else self.model.no_sync()):
                loss_sum = F.binary_cross_entropy_with_logits(self.model(x), y, reduction="sum")
                (loss_sum * self.world / rows).backward()  # DDP divides by world
            if boundary:
                self.opt.step()
                self.sched.step()
                self.opt.zero_grad(set_to_none=True)
                self.step += 1


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    first = Trainer(rank, world)
    first.train_until(STOP_AT)
    first.save()
    del first

    second = Trainer(rank, world)
    second.load()
    second.train_until(TOTAL_STEPS)
    if rank == 0:
        os.remove(CKPT)

    final = [(n, p.detach().float().contiguous()) for n, p in second.model.module.named_parameters()]
    h = hashlib.sha256()
    for _, t in final:
        h.update(t.numpy().tobytes())
    if rank == 0:
        print(f"FINAL_SHA256 {h.hexdigest()}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
