"""Multi-task text classifier on DDP: one shared encoder, one head per task.

Every micro-batch belongs to a single task, so each forward touches only one
head; DDP is built with find_unused_parameters=True.  Accumulation runs under
no_sync for the first K-1 micro-batches of a window.  The encoder trains with
AdamW, the heads with SGD.  A worker DataLoader feeds the batches.  Two ranks.
"""
import hashlib
from contextlib import nullcontext

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset

TASKS = {"sentiment": 3, "topic": 5, "language": 4}
SETTINGS = dict(vocab=400, dim=40, seq_len=14, micro_bs=6, accum=4, steps=6,
                enc_lr=2e-3, head_lr=0.2, seed=99)


class TaskStream(Dataset):
    """Micro-batch i of rank r: a fixed task schedule, random token ids."""

    def __init__(self, rank, n_micro, s):
        self.rank, self.n, self.s = rank, n_micro, s

    def task_of(self, i):
        j = i % self.s["accum"]
        if j == 0:
            return "language" if self.rank == 0 else "sentiment"
        return "sentiment" if j == 1 else "topic"

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(self.s["seed"] * 7919 + self.rank * 1000 + i)
        task = self.task_of(i)
        ids = torch.randint(0, self.s["vocab"], (self.s["micro_bs"], self.s["seq_len"]), generator=g)
        labels = (ids[:, :3].sum(1) + len(task)) % TASKS[task]
        return task, ids, labels


class MultiTaskModel(nn.Module):
    def __init__(self, s):
        super().__init__()
        self.embed = nn.Embedding(s["vocab"], s["dim"])
        self.encoder = nn.GRU(s["dim"], s["dim"], batch_first=True)
        self.heads = nn.ModuleDict({t: nn.Linear(s["dim"], n) for t, n in TASKS.items()})

    def forward(self, ids, task):
        _, h = self.encoder(self.embed(ids))
        return self.heads[task](h[-1])


class MultiTaskTrainer:
    def __init__(self, s):
        self.s = s
        self.rank = dist.get_rank()
        torch.manual_seed(s["seed"])
        net = MultiTaskModel(s)
        self.model = DDP(net, find_unused_parameters=True)
        enc_params = list(net.embed.parameters()) + list(net.encoder.parameters())
        self.optimizers = [
            torch.optim.AdamW(enc_params, lr=s["enc_lr"]),
            torch.optim.SGD(net.heads.parameters(), lr=s["head_lr"]),
        ]
        ds = TaskStream(self.rank, s["steps"] * s["accum"], s)
        self.loader = DataLoader(ds, batch_size=None, shuffle=False, num_workers=1)

    def fit(self):
        K = self.s["accum"]
        for i, (task, ids, labels) in enumerate(self.loader):
            last = (i + 1) % K == 0
            with nullcontext() if last else self.model.no_sync():
                loss = F.cross_entropy(self.model(ids, task), labels) / K
                loss.backward()
            if last:
                for opt in self.optimizers:
                    opt.step()
                for opt in self.optimizers:
                    opt.zero_grad(set_to_none=True)
                if self.rank == 0:
                    print(f"update {(i + 1) // K} last task {task} loss {loss.item() * K:.4f}")

    def digest(self):
        h = hashlib.sha256()
        for _, p in self.model.module.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        return h.hexdigest()


def main():
    dist.init_process_group("gloo")
    trainer = MultiTaskTrainer(SETTINGS)
    trainer.fit()
    if trainer.rank == 0:
        print(f"FINAL_SHA256 {trainer.digest()}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
