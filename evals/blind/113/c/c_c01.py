"""
Knowledge distillation, 2 DDP ranks (torchrun, gloo).

* frozen teacher (kept outside DDP, eval mode, no grad)
* student: the stem is frozen before the DDP wrap; the trunk is trained with AdamW and
  the classifier head with SGD + momentum (two optimizers, one clip over both)
* each rank's shard has 30 samples, batch 4 -> 8 micro-batches per epoch (the last one
  holds 2 samples); with K = 3 the windows are 3-3-2
* the loss of a window is normalised by the number of samples in the window over all
  ranks: each window is read ahead, its sample count all-reduced, and every micro-batch
  contributes sum(loss) * W / global_count (DDP then averages over the W ranks)
"""
import hashlib
import itertools
import os
from contextlib import nullcontext

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

SEED = 23
K = 3
EPOCHS = 3
BATCH = 4
TEMP = 2.0
ALPHA = 0.7
CLIP = 0.5
N_FEAT, N_CLS = 16, 4


def mlp(d_in, d_h, d_out, depth):
    layers, d = [], d_in
    for _ in range(depth):
        layers += [nn.Linear(d, d_h), nn.GELU()]
        d = d_h
    return nn.Sequential(*layers, nn.Linear(d, d_out))


class Student(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Linear(N_FEAT, 32)
        self.trunk = nn.Sequential(nn.GELU(), nn.Linear(32, 32), nn.GELU(), nn.LayerNorm(32))
        self.head = nn.Linear(32, N_CLS)

    def forward(self, x):
        return self.head(self.trunk(self.stem(x)))


def make_data():
    g = torch.Generator().manual_seed(SEED)
    x = torch.randn(60, N_FEAT, generator=g)
    w = torch.randn(N_FEAT, N_CLS, generator=g)
    y = (x @ w + 0.5 * torch.randn(60, N_CLS, generator=g)).argmax(-1)
    return TensorDataset(x, y)


def kd_loss_sum(s_logits, t_logits, y):
    kd = F.kl_div(F.log_softmax(s_logits / TEMP, -1), F.log_softmax(t_logits / TEMP, -1),
                  log_target=True, reduction="none").sum(-1) * TEMP ** 2
    ce = F.cross_entropy(s_logits, y, reduction="none")
    return (ALPHA * kd + (1 - ALPHA) * ce).sum()


def windows(loader, k):
    it = iter(loader)
    while True:
        w = list(itertools.islice(it, k))
        if not w:
            return
        yield w


def main():
    dist.init_process_group("gloo")
    rank, W = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(SEED)

    teacher = mlp(N_FEAT, 64, N_CLS, depth=3).eval()
    for p in teacher.parameters():
        p.requires_grad_(False)

    student = Student()
    student.stem.requires_grad_(False)
    model = DDP(student)
    opt_trunk = torch.optim.AdamW(student.trunk.parameters(), lr=3e-3, weight_decay=0.05)
    opt_head = torch.optim.SGD(student.head.parameters(), lr=5e-2, momentum=0.9)
    optimizers = (opt_trunk, opt_head)
    trainable = [p for p in student.parameters() if p.requires_grad]

    ds = make_data()
    sampler = DistributedSampler(ds, num_replicas=W, rank=rank, shuffle=True, seed=SEED)
    loader = DataLoader(ds, batch_size=BATCH, sampler=sampler, drop_last=False)

    step = 0
    for epoch in range(EPOCHS):
        sampler.set_epoch(epoch)
        for window in windows(loader, K):
            n_local = torch.tensor(float(sum(y.numel() for _, y in window)))
            dist.all_reduce(n_local)
            n_global = n_local.item()
            for i, (x, y) in enumerate(window):
                sync = i == len(window) - 1
                with (nullcontext() if sync else model.no_sync()):
                    with torch.no_grad():
                        t_logits = teacher(x)
                    s_logits = model(x)
                    loss = kd_loss_sum(s_logits, t_logits, y) * W / n_global
                    loss.backward()
            gnorm = torch.nn.utils.clip_grad_norm_(trainable, CLIP)
            for opt in optimizers:
                opt.step()
            for opt in optimizers:
                opt.zero_grad(set_to_none=True)
            step += 1
            if rank == 0:
                print(f"epoch {epoch} step {step} window {len(window)} n={int(n_global)} grad_norm {gnorm:.3f}", flush=True)

    if rank == 0:
        h = hashlib.sha256()
        for _, p in student.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
        if os.environ.get("PARAM_DUMP"):
            torch.save({n: p.detach().clone() for n, p in student.named_parameters()}, os.environ["PARAM_DUMP"])
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
