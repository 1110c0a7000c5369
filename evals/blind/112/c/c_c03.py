"""DDP recommender-style trainer: an SGD optimizer for the (sparse-ish) item table and AdamW
for the tower, a frozen feature projection, bf16 autocast, a worker DataLoader, and ranks with
different micro-batch sizes (3 vs 5). The loss is a sample sum over the window's all-ranks
sample count, times W because DDP averages; one clip over both optimizers' parameters."""
import hashlib
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset

N_ITEMS, FEAT, DIM, K, STEPS, PORT = 50, 12, 24, 3, 8, 49209


class Clicks(Dataset):
    def __init__(self, rank, n):
        g = torch.Generator().manual_seed(2024 + rank)
        self.items = torch.randint(0, N_ITEMS, (n,), generator=g)
        self.feats = torch.randn(n, FEAT, generator=g)
        self.y = ((self.feats[:, 0] + 0.1 * self.items.float() / N_ITEMS) > 0).float()

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return self.items[i], self.feats[i], self.y[i]


class Tower(nn.Module):
    def __init__(self):
        super().__init__()
        self.item_table = nn.Embedding(N_ITEMS, DIM)
        self.feat_proj = nn.Linear(FEAT, DIM)
        self.mlp = nn.Sequential(nn.Linear(2 * DIM, DIM), nn.ReLU(), nn.Linear(DIM, 1))

    def forward(self, item, feat):
        return self.mlp(torch.cat([self.item_table(item), self.feat_proj(feat)], -1)).squeeze(-1)


class TwoOptTrainer:
    def __init__(self, rank, world):
        self.rank, self.world = rank, world
        torch.manual_seed(0)
        self.net = Tower()
        self.net.feat_proj.requires_grad_(False)
        self.model = DDP(self.net)
        self.opt_table = torch.optim.SGD(self.net.item_table.parameters(), lr=0.5)
        self.opt_tower = torch.optim.AdamW(self.net.mlp.parameters(), lr=3e-3)
        self.bs = 3 if rank == 0 else 5
        ds = Clicks(rank, self.bs * K * STEPS)
        self.loader = DataLoader(ds, batch_size=self.bs, shuffle=False, num_workers=1)

    def optimizers(self):
        return (self.opt_table, self.opt_tower)

    def train(self):
        it = iter(self.loader)
        for _ in range(STEPS):
            window = [next(it) for _ in range(K)]
            count = torch.tensor(float(sum(len(b[2]) for b in window)))
            dist.all_reduce(count)
            for j, (item, feat, y) in enumerate(window):
                self.model.require_backward_grad_sync = j == K - 1
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    logit = self.model(item, feat)
                loss = F.binary_cross_entropy_with_logits(logit.float(), y, reduction="sum")
                (loss * self.world / count).backward()
            torch.nn.utils.clip_grad_norm_([p for p in self.net.parameters() if p.requires_grad], 0.3)
            for o in self.optimizers():
                o.step()
            for o in self.optimizers():
                o.zero_grad(set_to_none=True)


def sha(m):
    h = hashlib.sha256()
    for _, p in m.named_parameters():
        h.update(p.detach().float().contiguous().numpy().tobytes())
    return h.hexdigest()


def worker(rank, world):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(PORT)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    t = TwoOptTrainer(rank, world)
    t.train()
    if rank == 0:
        print("FINAL_SHA256", sha(t.net), flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(worker, args=(2,), nprocs=2, join=True)
