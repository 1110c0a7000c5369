"""Knowledge distillation into a small student, DDP on 2 ranks spawned from this script.

- the teacher is frozen and not wrapped; the student's input projection is frozen too
- two optimizers: AdamW for the student body, SGD with momentum for the classifier head
- a DataLoader with a worker process and a DistributedSampler: 8 micro-batches per rank and
  epoch with K = 3, so each epoch ends in a 2-batch window, scaled by its own length
- one gradient-norm clip over all trainable parameters at each optimizer step
"""
import contextlib
import hashlib
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

WORLD, PORT = 2, 49251
IN_DIM, N_CLS = 24, 7
MICRO, ACCUM, EPOCHS = 8, 3, 3
TEMP, ALPHA, MAX_NORM = 2.0, 0.7, 0.05


class Student(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(IN_DIM, 32)
        self.body = nn.Sequential(nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 32))
        self.head = nn.Linear(32, N_CLS)

    def forward(self, x):
        return self.head(self.body(self.proj(x)))


def make_dataset():
    g = torch.Generator().manual_seed(11)
    x = torch.randn(WORLD * 8 * MICRO, IN_DIM, generator=g)
    y = (x[:, :N_CLS] + 0.5 * torch.randn(x.size(0), N_CLS, generator=g)).argmax(1)
    return TensorDataset(x, y)


def distill_loss(s_logits, t_logits, y):
    kd = F.kl_div(F.log_softmax(s_logits / TEMP, -1), F.log_softmax(t_logits / TEMP, -1),
                  log_target=True, reduction="batchmean") * TEMP * TEMP
    ce = F.cross_entropy(s_logits, y)
    return ALPHA * kd + (1 - ALPHA) * ce


def worker(rank):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(PORT)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)

    torch.manual_seed(5)
    teacher = nn.Sequential(nn.Linear(IN_DIM, 64), nn.ReLU(), nn.Linear(64, N_CLS)).eval()
    teacher.requires_grad_(False)
    student = Student()
    student.proj.requires_grad_(False)
    ddp = DDP(student)
    opt_body = torch.optim.AdamW(student.body.parameters(), lr=2e-3, weight_decay=0.05)
    opt_head = torch.optim.SGD(student.head.parameters(), lr=5e-2, momentum=0.9)
    optimizers = [opt_body, opt_head]
    trainable = [p for p in student.parameters() if p.requires_grad]

    ds = make_dataset()
    sampler = DistributedSampler(ds, num_replicas=WORLD, rank=rank, shuffle=True, seed=17)
    loader = DataLoader(ds, batch_size=MICRO, sampler=sampler, num_workers=1,
                        persistent_workers=True)
    n_batches = len(loader)

    step = 0
    for epoch in range(EPOCHS):
        sampler.set_epoch(epoch)
        for i, (x, y) in enumerate(loader):
            window_start = (i // ACCUM) * ACCUM
            window_len = min(ACCUM, n_batches - window_start)
            boundary = (i + 1) % ACCUM == 0 or i + 1 == n_batches
            with (contextlib.nullcontext() if boundary else ddp.no_sync()):
                with torch.no_grad():
                    t_logits = teacher(x)
                loss = distill_loss(ddp(x), t_logits, y) / window_len
                loss.backward()
            if boundary:
                norm = torch.nn.utils.clip_grad_norm_(trainable, MAX_NORM)
                for opt in optimizers:
                    opt.step()
                for opt in optimizers:
                    opt.zero_grad(set_to_none=True)
                step += 1
                if rank == 0 and step % 3 == 0:
                    print(f"step {step} grad-norm {norm:.3f} loss {loss.item() * window_len:.4f}")

    if rank == 0:
        h = hashlib.sha256()
        for _, p in student.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(worker, nprocs=WORLD, join=True)
