"""DDP trainer: ranks of different micro-batch sizes, 3-3-2 windows, two optimizers,
stopped after the first epoch and resumed into freshly built objects.

Rank 0 reads 3 rows per micro-batch, rank 1 reads 5. The loss of a window is the sum of
per-row losses over the window's row count on all ranks (times the world size, which DDP's
average divides back out).

    torchrun --nproc-per-node 2 --master-addr 127.0.0.1 --master-port 49041 a_c02.py
"""
import hashlib
import os
import tempfile

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

CFG = dict(d_in=12, d_hidden=40, n_out=3, rows=(3, 5), batches_per_epoch=8, accum=3, epochs=3,
           lr_body=2e-3, lr_head=5e-2, seed=23)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(CFG["d_in"], CFG["d_hidden"]), nn.Tanh(),
                                  nn.Linear(CFG["d_hidden"], CFG["d_hidden"]), nn.Tanh())
        self.head = nn.Linear(CFG["d_hidden"], CFG["n_out"])

    def forward(self, x):
        return self.head(self.body(x))


def epoch_batches(rank, epoch):
    g = torch.Generator().manual_seed(CFG["seed"] * 1000 + epoch * 10 + rank)
    rows = CFG["rows"][rank]
    out = []
    for _ in range(CFG["batches_per_epoch"]):
        x = torch.randn(rows, CFG["d_in"], generator=g)
        y = torch.stack([x[:, :4].sum(1), x[:, 4:8].prod(1), torch.sin(x[:, 8:]).sum(1)], 1)
        out.append((x, y))
    return out


def windows(batches, k):
    return [batches[i:i + k] for i in range(0, len(batches), k)]


class Trainer:
    def __init__(self):
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        torch.manual_seed(CFG["seed"])
        self.ddp = DDP(Net())
        net = self.ddp.module
        self.opt_body = torch.optim.AdamW(net.body.parameters(), lr=CFG["lr_body"])
        self.opt_head = torch.optim.SGD(net.head.parameters(), lr=CFG["lr_head"], momentum=0.9)
        self.sched = torch.optim.lr_scheduler.StepLR(self.opt_body, step_size=4, gamma=0.5)
        self.epoch = 0

    def state_dict(self):
        return {"model": self.ddp.module.state_dict(), "opt_body": self.opt_body.state_dict(),
                "opt_head": self.opt_head.state_dict(), "sched": self.sched.state_dict(),
                "epoch": self.epoch}

    def load_state_dict(self, sd):
        self.ddp.module.load_state_dict(sd["model"])
        self.opt_body.load_state_dict(sd["opt_body"])
        self.opt_head.load_state_dict(sd["opt_head"])
        self.sched.load_state_dict(sd["sched"])
        self.epoch = sd["epoch"]

    def window_rows(self, window):
        n = torch.tensor(float(sum(x.shape[0] for x, _ in window)))
        dist.all_reduce(n)
        return n

    def run_window(self, window):
        n_all = self.window_rows(window)
        for j, (x, y) in enumerate(window):
            last = j == len(window) - 1
            self.ddp.require_backward_grad_sync = last
            pred = self.ddp(x)
            loss = F.smooth_l1_loss(pred, y, reduction="sum") * self.world / n_all
            loss.backward()
        for opt in (self.opt_body, self.opt_head):
            opt.step()
            opt.zero_grad(set_to_none=True)
        self.sched.step()

    def train_epochs(self, until):
        while self.epoch < until:
            for w in windows(epoch_batches(self.rank, self.epoch), CFG["accum"]):
                self.run_window(w)
            self.epoch += 1
            if self.rank == 0:
                print(f"epoch {self.epoch} done, lr_body {self.sched.get_last_lr()[0]:.2e}", flush=True)

    def digest(self):
        h = hashlib.sha256()
        for _, p in self.ddp.module.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        return h.hexdigest()


def main():
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    ckpt = os.path.join(tempfile.gettempdir(), f"a_c02_{os.environ['MASTER_PORT']}.pt")

    first = Trainer()
    first.train_epochs(until=1)
    if dist.get_rank() == 0:
        torch.save(first.state_dict(), ckpt)
    dist.barrier()
    del first

    second = Trainer()  # fresh model, optimizers, scheduler
    second.load_state_dict(torch.load(ckpt, weights_only=False))
    dist.barrier()
    if dist.get_rank() == 0:
        os.remove(ckpt)
    second.train_epochs(until=CFG["epochs"])
    d = second.digest()
    if dist.get_rank() == 0:
        print(f"FINAL_SHA256 {d}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
