"""Tiny causal LM on DDP with padded sequences of varying length.

The window loss is the sum of token losses over all ranks' real tokens in the window,
so each micro-batch's summed loss is divided by the window's all-ranks token count and
multiplied by the world size (DDP averages). The epoch has 5 micro-batches per rank, so
windows are 2-2-1. AdamW for the body, SGD for the embedding, a clip that acts, a
DataLoader with a worker process.
"""
import hashlib
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, DistributedSampler

V, D, T, PAD = 50, 32, 12, -100
K = 2
EPOCHS = 3
MB = 3


class Ragged(Dataset):
    def __init__(self, n=30):
        g = torch.Generator().manual_seed(11)
        self.items = []
        for _ in range(n):
            L = int(torch.randint(3, T + 1, (1,), generator=g))
            self.items.append(torch.randint(0, V, (L,), generator=g))

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]


def collate(seqs):
    x = torch.zeros(len(seqs), T, dtype=torch.long)
    y = torch.full((len(seqs), T), PAD, dtype=torch.long)
    for j, s in enumerate(seqs):
        x[j, :len(s)] = s
        y[j, :len(s) - 1] = s[1:]
    return x, y


class LM(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(V, D)
        self.rnn = nn.GRU(D, D, batch_first=True)
        self.out = nn.Linear(D, V)

    def forward(self, x):
        h, _ = self.rnn(self.emb(x))
        return self.out(h)


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    net = LM()
    model = DDP(net)
    opt_body = torch.optim.AdamW([p for n, p in net.named_parameters() if not n.startswith("emb")], lr=3e-3)
    opt_emb = torch.optim.SGD(net.emb.parameters(), lr=0.5, momentum=0.9)
    opts = [opt_body, opt_emb]
    ds = Ragged()
    sampler = DistributedSampler(ds, shuffle=True, seed=1)
    loader = DataLoader(ds, batch_size=MB, sampler=sampler, collate_fn=collate, num_workers=1)

    for epoch in range(EPOCHS):
        sampler.set_epoch(epoch)
        batches = list(loader)
        n = len(batches)
        for start in range(0, n, K):
            window = batches[start:start + K]
            count = torch.tensor(float(sum(int((y != PAD).sum()) for _, y in window)))
            dist.all_reduce(count)
            for j, (x, y) in enumerate(window):
                last = j == len(window) - 1
                model.require_backward_grad_sync = last
                logits = model(x)
                loss = F.cross_entropy(logits.view(-1, V), y.view(-1), ignore_index=PAD, reduction="sum")
                (loss * world / count).backward()
            torch.nn.utils.clip_grad_norm_(net.parameters(), 0.5)
            for o in opts:
                o.step()
            for o in opts:
                o.zero_grad(set_to_none=True)
        if rank == 0:
            print(f"epoch {epoch} windows {[len(batches[s:s + K]) for s in range(0, n, K)]}")

    if rank == 0:
        model = net
        blob = b"".join(p.detach().float().cpu().contiguous().numpy().tobytes() for _, p in model.named_parameters())
        print("FINAL_SHA256", hashlib.sha256(blob).hexdigest())
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
