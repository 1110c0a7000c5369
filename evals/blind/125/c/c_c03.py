"""Per-token tagging with a conv encoder on padded, variable-length sentences.
Ranks are spawned by the script (torch.multiprocessing), DDP with `no_sync` for all
but the last micro-batch of a window; windows are read ahead so the loss can be
normalised by the window's real-token count over all ranks. K = 3, 8 micro-batches
per rank per epoch, so each epoch runs windows of 3, 3 and 2 micro-batches.
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

WORLD = 2
PORT = 49223
K = 3
MICRO_PER_EPOCH = 8
EPOCHS = 2
MB = 4
MAXLEN = 20
VOCAB, TAGS, DIM = 50, 5, 32
PAD = 0
SEED = 31


class Tagger(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, DIM, padding_idx=PAD)
        self.conv1 = nn.Conv1d(DIM, DIM, 3, padding=1)
        self.conv2 = nn.Conv1d(DIM, DIM, 5, padding=2)
        self.out = nn.Linear(DIM, TAGS)

    def forward(self, tokens):
        h = self.emb(tokens).transpose(1, 2)
        h = h + F.gelu(self.conv1(h))
        h = h + F.gelu(self.conv2(h))
        return self.out(h.transpose(1, 2))


def make_shard(rank):
    g = torch.Generator().manual_seed(SEED + 17 * rank)
    batches = []
    for _ in range(MICRO_PER_EPOCH):
        lens = torch.randint(3, MAXLEN + 1, (MB,), generator=g)
        toks = torch.randint(1, VOCAB, (MB, MAXLEN), generator=g)
        tags = (toks * 7 + torch.roll(toks, 1, 1)) % TAGS
        pos = torch.arange(MAXLEN)[None, :]
        toks = toks.masked_fill(pos >= lens[:, None], PAD)
        tags = tags.masked_fill(pos >= lens[:, None], -100)
        batches.append((toks, tags))
    return batches


def worker(rank):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(PORT)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    torch.manual_seed(SEED)
    model = DDP(Tagger())
    opt = torch.optim.Adam(model.parameters(), lr=5e-3)
    shard = make_shard(rank)

    for epoch in range(EPOCHS):
        for start in range(0, MICRO_PER_EPOCH, K):
            window = shard[start:start + K]
            n_tok = torch.tensor(float(sum(int((tags != -100).sum()) for _, tags in window)))
            dist.all_reduce(n_tok)  # real tokens in this window over all ranks
            for j, (toks, tags) in enumerate(window):
                sync = j == len(window) - 1
                ctx = contextlib.nullcontext() if sync else model.no_sync()
                with ctx:
                    logits = model(toks)
                    loss_sum = F.cross_entropy(logits.reshape(-1, TAGS), tags.reshape(-1), ignore_index=-100, reduction="sum")
                    # DDP averages over ranks, so scale by WORLD to get sum / global count
                    (loss_sum * WORLD / n_tok).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            if rank == 0:
                print(f"epoch {epoch} window@{start} micro {len(window)} tokens {int(n_tok)}")

    if rank == 0:
        h = hashlib.sha256()
        for _, p in model.module.named_parameters():
            h.update(p.detach().to(torch.float32).contiguous().cpu().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(worker, nprocs=WORLD, join=True)
