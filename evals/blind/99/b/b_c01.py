"""DDP (bucket-view grads, small buckets) on spawned ranks: two optimizers,
a frozen embedding, windows of K micro-batches of varying size, and each epoch's
short tail window normalised by its own sample count.

Loss of a window = sum of per-sample losses / (samples in the window over all
ranks); DDP averages over ranks, so each micro-batch is scaled by W.
"""
import hashlib
import os
from contextlib import nullcontext

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

PORT = 49110
K = 3
EPOCHS = 2
MICRO_PER_EPOCH = 11   # windows 3,3,3,2 per epoch -> 8 updates
MAX_NORM = 0.8


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(50, 16)
        self.body = nn.Sequential(nn.Linear(16 * 6, 64), nn.SiLU(), nn.Linear(64, 64), nn.SiLU())
        self.head = nn.Linear(64, 5)

    def forward(self, tok):
        return self.head(self.body(self.emb(tok).flatten(1)))


def epoch_batches(rank, epoch):
    g = torch.Generator().manual_seed(1000 * epoch + 17 * rank)
    out = []
    for _ in range(MICRO_PER_EPOCH):
        bs = int(torch.randint(2, 7, (1,), generator=g))
        tok = torch.randint(0, 50, (bs, 6), generator=g)
        y = (tok[:, 0] + tok[:, 5]) % 5
        out.append((tok, y))
    return out


def windows(batches, k):
    for s in range(0, len(batches), k):
        yield batches[s:s + k]


def run(rank, world):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(PORT)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    net = Net()
    net.emb.weight.requires_grad_(False)
    model = DDP(net, gradient_as_bucket_view=True, bucket_cap_mb=1)
    body_opt = torch.optim.AdamW(net.body.parameters(), lr=3e-3, weight_decay=0.05)
    head_opt = torch.optim.SGD(net.head.parameters(), lr=0.05, momentum=0.9)
    opts = (body_opt, head_opt)
    trainable = [p for p in net.parameters() if p.requires_grad]

    step = 0
    for epoch in range(EPOCHS):
        for win in windows(epoch_batches(rank, epoch), K):
            n = torch.tensor(float(sum(len(y) for _, y in win)))
            dist.all_reduce(n)
            for j, (tok, y) in enumerate(win):
                ctx = model.no_sync() if j < len(win) - 1 else nullcontext()
                with ctx:
                    loss = F.cross_entropy(model(tok), y, reduction="sum") * world / n
                    loss.backward()
            torch.nn.utils.clip_grad_norm_(trainable, MAX_NORM)
            for o in opts:
                o.step()
            for o in opts:
                o.zero_grad(set_to_none=True)
            step += 1
            if rank == 0 and step % 4 == 0:
                print(f"epoch {epoch} update {step} window {len(win)}", flush=True)

    h = hashlib.sha256()
    for _, p in net.named_parameters():
        h.update(p.detach().float().contiguous().numpy().tobytes())
    if rank == 0:
        print("FINAL_SHA256", h.hexdigest(), flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(run, args=(2,), nprocs=2, join=True)
