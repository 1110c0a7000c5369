"""Mean-teacher distillation on DDP (torchrun), hand accumulation over K = 3, bf16 autocast
forwards with fp32 weights, SGD for the trunk and AdamW for the head. Training stops at a window
boundary, checkpoints, and resumes into freshly built objects."""
import copy
import hashlib
import os
import tempfile

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

K, TOTAL, STOP_AT = 3, 12, 5
MICRO_BS, DIM, CLASSES = 6, 16, 5
EMA_DECAY, KD_WEIGHT = 0.9, 0.5


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.trunk = nn.Sequential(nn.Linear(DIM, 48), nn.ReLU(), nn.Linear(48, 48), nn.ReLU())
        self.head = nn.Linear(48, CLASSES)

    def forward(self, x):
        return self.head(self.trunk(x))


def stream(rank):
    g = torch.Generator().manual_seed(40 + rank)
    proj = torch.randn(DIM, CLASSES, generator=torch.Generator().manual_seed(1))
    for _ in range(TOTAL * K):
        x = torch.randn(MICRO_BS, DIM, generator=g)
        yield x, (x @ proj).argmax(1)


class Trainer:
    def __init__(self, rank):
        torch.manual_seed(0)
        self.rank = rank
        self.model = DDP(Net())
        self.teacher = copy.deepcopy(self.model.module).requires_grad_(False)
        m = self.model.module
        self.opt_trunk = torch.optim.SGD(m.trunk.parameters(), lr=0.1, momentum=0.9)
        self.opt_head = torch.optim.AdamW(m.head.parameters(), lr=3e-3)
        self.update = 0

    def micro_loss(self, x, y):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            s = self.model(x)
            with torch.no_grad():
                t = self.teacher(x)
        s, t = s.float(), t.float()
        return F.cross_entropy(s, y) + KD_WEIGHT * F.mse_loss(s, t)

    def run_window(self, window):
        for j, (x, y) in enumerate(window):
            ctx = self.model.no_sync() if j < len(window) - 1 else torch.enable_grad()
            with ctx:
                (self.micro_loss(x, y) / K).backward()
        self.opt_trunk.step()
        self.opt_head.step()
        self.opt_trunk.zero_grad(set_to_none=True)
        self.opt_head.zero_grad(set_to_none=True)
        with torch.no_grad():
            for pt, ps in zip(self.teacher.parameters(), self.model.module.parameters()):
                pt.lerp_(ps, 1 - EMA_DECAY)
        self.update += 1

    def state(self):
        return dict(model=self.model.module.state_dict(), teacher=self.teacher.state_dict(),
                    opt_trunk=self.opt_trunk.state_dict(), opt_head=self.opt_head.state_dict(),
                    update=self.update)

    def load(self, s):
        self.model.module.load_state_dict(s["model"])
        self.teacher.load_state_dict(s["teacher"])
        self.opt_trunk.load_state_dict(s["opt_trunk"])
        self.opt_head.load_state_dict(s["opt_head"])
        self.update = s["update"]


def windows(rank, start):
    data = list(stream(rank))
    for u in range(start, TOTAL):
        yield data[u * K:(u + 1) * K]


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.use_deterministic_algorithms(True)
    ckdir = os.path.join(tempfile.gettempdir(), "c_c03_ckpt_49215")
    path = os.path.join(ckdir, f"rank{rank}.pt")
    os.makedirs(ckdir, exist_ok=True)

    tr = Trainer(rank)
    for w in windows(rank, 0):
        tr.run_window(w)
        if tr.update == STOP_AT:
            torch.save(tr.state(), path)
            break
    del tr
    dist.barrier()

    tr = Trainer(rank)  # fresh objects, then resume
    tr.load(torch.load(path))
    for w in windows(rank, tr.update):
        tr.run_window(w)

    if rank == 0:
        h = hashlib.sha256()
        for _, p in tr.model.module.named_parameters():
            h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
        print("FINAL_SHA256", h.hexdigest())
    dist.barrier()
    os.remove(path)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
