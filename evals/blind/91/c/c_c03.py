"""Bradley-Terry reward model on 2 DDP ranks (torchrun), bf16 autocast on CPU.

- ranks hold shards of different sizes (36 and 27 pairs) with micro-batches of 4 and 3
  pairs: the loss is the sum of -logsigmoid(r_chosen - r_rejected) over the window divided
  by the window's all-ranks pair count, times the world size (DDP averages)
- a DataLoader with a worker process per rank
- frozen token embedding, AdamW with a no-decay group for biases and norms
- K = 3, 3 epochs
"""
import contextlib
import hashlib
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset

VOCAB, SEQ, D = 50, 12, 32
K = 3
EPOCHS = 3


class PairShard(Dataset):
    def __init__(self, rank, n):
        g = torch.Generator().manual_seed(500 + rank)
        self.chosen = torch.randint(0, VOCAB, (n, SEQ), generator=g)
        self.rejected = torch.randint(0, VOCAB, (n, SEQ), generator=g)
        # chosen answers use more "good" tokens (< 10)
        good = torch.rand(n, SEQ, generator=g) < 0.3
        self.chosen[good] = self.chosen[good] % 10

    def __len__(self):
        return len(self.chosen)

    def __getitem__(self, i):
        return self.chosen[i], self.rejected[i]


class RewardModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, D)
        self.encoder = nn.Sequential(nn.Linear(D, 64), nn.GELU(), nn.Linear(64, D))
        self.norm = nn.LayerNorm(D)
        self.v_head = nn.Linear(D, 1)

    def forward(self, ids):
        h = self.embed(ids)
        h = h + self.encoder(h)
        return self.v_head(self.norm(h).mean(1)).squeeze(-1)


def params_sha256(module):
    h = hashlib.sha256()
    for _, p in module.named_parameters():
        h.update(p.detach().to(torch.float32).contiguous().cpu().numpy().tobytes())
    return h.hexdigest()


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)
    torch.manual_seed(0)

    model = RewardModel()
    model.embed.weight.requires_grad_(False)
    decay = [p for n, p in model.named_parameters() if p.requires_grad and p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.requires_grad and p.dim() < 2]
    ddp = DDP(model)
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}], lr=3e-3)

    shard = PairShard(rank, 36 if rank == 0 else 27)
    loader = DataLoader(shard, batch_size=4 if rank == 0 else 3, shuffle=True, num_workers=1,
                        generator=torch.Generator().manual_seed(rank), persistent_workers=True)

    for epoch in range(EPOCHS):
        batches = list(loader)          # 9 micro-batches on each rank
        for w0 in range(0, len(batches), K):
            window = batches[w0:w0 + K]
            n_pairs = torch.tensor(float(sum(c.size(0) for c, _ in window)))
            dist.all_reduce(n_pairs)
            opt.zero_grad(set_to_none=True)
            for i, (chosen, rejected) in enumerate(window):
                ctx = contextlib.nullcontext() if i == len(window) - 1 else ddp.no_sync()
                with ctx:
                    with torch.autocast("cpu", dtype=torch.bfloat16):
                        r = ddp(torch.cat([chosen, rejected]))
                    rc, rr = r.float().chunk(2)
                    loss = -F.logsigmoid(rc - rr).sum() * world / n_pairs
                    loss.backward()
            opt.step()

    if rank == 0:
        print(f"FINAL_SHA256 {params_sha256(model)}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
