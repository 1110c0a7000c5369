"""Logit distillation on spawned DDP ranks: frozen teacher, student with a frozen
embedding, a DataLoader with a worker, two optimizers (AdamW for the body, SGD with
momentum for the head). Epochs of 7 micro-batches with ACCUM 3 give windows of
3, 3, 1; each window's loss is the mean over the samples it really holds.
"""
import os
import hashlib
import contextlib
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset, DistributedSampler

PORT = 48251
ACCUM = 3
MICRO_BS = 6
EPOCHS = 3
TEMP = 2.0
N_CLASSES = 10


class Net(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.emb = nn.Embedding(50, 16)
        self.body = nn.Sequential(nn.Linear(16 * 6, width), nn.GELU(), nn.Linear(width, width), nn.GELU())
        self.head = nn.Linear(width, N_CLASSES)

    def forward(self, tok):
        return self.head(self.body(self.emb(tok).flatten(1)))


def worker(rank, world):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(PORT)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    teacher = Net(96).eval().requires_grad_(False)
    student = Net(32)
    student.emb.requires_grad_(False)
    model = DDP(student)
    opt_body = torch.optim.AdamW(student.body.parameters(), lr=2e-3, weight_decay=0.01)
    opt_head = torch.optim.SGD(student.head.parameters(), lr=5e-2, momentum=0.9)
    opts = (opt_body, opt_head)

    g = torch.Generator().manual_seed(3)
    tokens = torch.randint(0, 50, (84, 6), generator=g)  # 84 / (2 ranks * 6) = 7 micro-batches per rank
    labels = torch.randint(0, N_CLASSES, (84,), generator=g)
    sampler = DistributedSampler(TensorDataset(tokens, labels), num_replicas=world, rank=rank, shuffle=True, seed=9)
    loader = DataLoader(TensorDataset(tokens, labels), batch_size=MICRO_BS, sampler=sampler, num_workers=1,
                        persistent_workers=False)

    for epoch in range(EPOCHS):
        sampler.set_epoch(epoch)
        batches = list(loader)
        for w0 in range(0, len(batches), ACCUM):
            window = batches[w0:w0 + ACCUM]
            n_samples = sum(len(y) for _, y in window)  # same on both ranks (even shards)
            for o in opts:
                o.zero_grad(set_to_none=True)
            for i, (tok, y) in enumerate(window):
                ctx = contextlib.nullcontext() if i == len(window) - 1 else model.no_sync()
                with ctx:
                    s_logits = model(tok)
                    with torch.no_grad():
                        t_logits = teacher(tok)
                    kd = F.kl_div(F.log_softmax(s_logits / TEMP, -1), F.log_softmax(t_logits / TEMP, -1),
                                  log_target=True, reduction="sum") * TEMP ** 2
                    ce = F.cross_entropy(s_logits, y, reduction="sum")
                    ((0.7 * kd + 0.3 * ce) / n_samples).backward()
            for o in opts:
                o.step()
        if rank == 0:
            print(f"epoch {epoch} windows {[len(batches[i:i + ACCUM]) for i in range(0, len(batches), ACCUM)]}", flush=True)

    h = hashlib.sha256()
    for _, p in student.named_parameters():
        h.update(p.detach().float().contiguous().numpy().tobytes())
    if rank == 0:
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(worker, args=(2,), nprocs=2, join=True)
