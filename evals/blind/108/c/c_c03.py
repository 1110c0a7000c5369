"""Bradley-Terry reward model on 2 DDP ranks, bf16 autocast, a DataLoader worker.

Pairs whose preference label is a tie are masked out, so every micro-batch has a
different number of usable pairs.  Each epoch has 8 micro-batches per rank and
K = 3, so the windows are 3-3-2; every window is the sum of pair losses over the
window's all-ranks usable-pair count, times W (DDP averages).  The backbone
(AdamW) and the scalar reward head (SGD) have separate optimizers; a centring
penalty keeps rewards near 0 and is normalised the same way.
"""
import contextlib
import hashlib
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, DistributedSampler

VOCAB, SEQ, PAIRS, BS, K, EPOCHS = 30, 12, 64, 4, 3, 3


class Prefs(Dataset):
    def __init__(self):
        g = torch.Generator().manual_seed(99)
        self.a = torch.randint(0, VOCAB, (PAIRS, SEQ), generator=g)
        self.b = torch.randint(0, VOCAB, (PAIRS, SEQ), generator=g)
        score = lambda x: (x < 10).float().sum(1)
        diff = score(self.a) - score(self.b)
        self.label = torch.sign(diff)          # +1: a preferred, -1: b preferred, 0: tie

    def __len__(self):
        return PAIRS

    def __getitem__(self, i):
        return self.a[i], self.b[i], self.label[i]


class RewardModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, 32)
        self.enc = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 32))
        self.head = nn.Linear(32, 1)

    def forward(self, ids):
        return self.head(self.enc(self.emb(ids)).mean(1)).squeeze(-1)


def main():
    dist.init_process_group("gloo")
    rank, W = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(5)
    rm = DDP(RewardModel())
    head_params = list(rm.module.head.parameters())
    body_params = [p for n, p in rm.module.named_parameters() if not n.startswith("head")]
    opts = [torch.optim.AdamW(body_params, lr=3e-3), torch.optim.SGD(head_params, lr=5e-2)]

    ds = Prefs()
    sampler = DistributedSampler(ds, num_replicas=W, rank=rank, shuffle=True, seed=1)
    loader = DataLoader(ds, batch_size=BS, sampler=sampler, num_workers=1,
                        multiprocessing_context="spawn", persistent_workers=True,
                        generator=torch.Generator().manual_seed(0))

    for epoch in range(EPOCHS):
        sampler.set_epoch(epoch)
        batches = list(loader)
        for w0 in range(0, len(batches), K):
            win = batches[w0:w0 + K]
            n = torch.stack([(lab != 0).sum() for _, _, lab in win]).sum().float()
            dist.all_reduce(n)
            for k, (a, b, lab) in enumerate(win):
                ctx = rm.no_sync() if k < len(win) - 1 else contextlib.nullcontext()
                with ctx:
                    with torch.autocast("cpu", dtype=torch.bfloat16):
                        r = rm(torch.cat([a, b], 0))
                    r = r.float()
                    ra, rb = r[: len(a)], r[len(a):]
                    keep = (lab != 0).float()
                    pair = -F.logsigmoid(lab * (ra - rb)) * keep
                    center = 0.01 * (ra + rb) ** 2 * keep
                    ((pair + center).sum() * W / n).backward()
            for o in opts:
                o.step()
            for o in opts:
                o.zero_grad(set_to_none=True)

    h, flat = hashlib.sha256(), []
    for _, p in rm.module.named_parameters():
        t = p.detach().float().contiguous()
        h.update(t.numpy().tobytes())
        flat.append(t.reshape(-1))
    if rank == 0:
        if os.environ.get("PARAM_DUMP"):
            torch.save(torch.cat(flat), os.environ["PARAM_DUMP"])
        print("FINAL_SHA256", h.hexdigest())
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
