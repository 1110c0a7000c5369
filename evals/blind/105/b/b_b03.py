"""Text-classification style trainer on DDP (2 CPU ranks, gloo) with no_sync
gradient accumulation and a warm-up + cosine schedule from transformers."""
import argparse
import contextlib
import hashlib
import math
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset
from transformers import get_cosine_schedule_with_warmup


def get_args():
    ap = argparse.ArgumentParser()
    ap.add_argument("--per_device_train_batch_size", type=int, default=8)
    ap.add_argument("--gradient_accumulation_steps", type=int, default=2)
    ap.add_argument("--num_train_epochs", type=int, default=2)
    ap.add_argument("--learning_rate", type=float, default=3e-3)
    ap.add_argument("--warmup_steps", type=int, default=2)
    ap.add_argument("--n_samples", type=int, default=256)
    ap.add_argument("--seed", type=int, default=0)
    return ap.parse_args()


class BagClassifier(nn.Module):
    def __init__(self, vocab=200, dim=32, n_cls=4):
        super().__init__()
        self.emb = nn.EmbeddingBag(vocab, dim, mode="mean")
        self.ff = nn.Sequential(nn.Linear(dim, 64), nn.ReLU(), nn.Linear(64, n_cls))

    def forward(self, ids):
        return self.ff(self.emb(ids))


def build_dataset(n, seed, vocab=200, length=12, n_cls=4):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (n, length), generator=g)
    labels = (ids % n_cls).mode(dim=1).values
    return TensorDataset(ids, labels)


class Trainer:
    def __init__(self, args):
        self.args = args
        self.rank = dist.get_rank()
        self.world = dist.get_world_size()
        torch.manual_seed(args.seed)
        self.train_set = build_dataset(args.n_samples, args.seed)
        self.sampler = DistributedSampler(self.train_set, shuffle=True, seed=args.seed)
        self.loader = DataLoader(self.train_set, batch_size=args.per_device_train_batch_size, sampler=self.sampler)
        self.model = DDP(BagClassifier())
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=args.learning_rate, weight_decay=0.01)
        self.create_scheduler()

    def create_scheduler(self):
        a = self.args
        updates_per_epoch = math.ceil(len(self.train_set) / (a.per_device_train_batch_size * a.gradient_accumulation_steps))
        self.max_steps = updates_per_epoch * a.num_train_epochs
        self.scheduler = get_cosine_schedule_with_warmup(self.optimizer, a.warmup_steps, self.max_steps)

    def micro_step(self, batch, sync):
        ids, y = batch
        ctx = contextlib.nullcontext() if sync else self.model.no_sync()
        with ctx:
            loss = F.cross_entropy(self.model(ids), y) / self.args.gradient_accumulation_steps
            loss.backward()
        return loss.detach()

    def optimizer_step(self):
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)

    def train(self):
        K = self.args.gradient_accumulation_steps
        n_updates = 0
        for epoch in range(self.args.num_train_epochs):
            self.sampler.set_epoch(epoch)
            for i, batch in enumerate(self.loader):
                sync = (i + 1) % K == 0
                self.micro_step(batch, sync)
                if sync:
                    self.optimizer_step()
                    n_updates += 1
        return n_updates

    def digest(self):
        h = hashlib.sha256()
        for _, p in self.model.module.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        return h.hexdigest()


def main():
    args = get_args()
    dist.init_process_group("gloo")
    tr = Trainer(args)
    n = tr.train()
    if tr.rank == 0:
        print(f"updates {n} horizon {tr.max_steps} last_lr {tr.scheduler.get_last_lr()[0]:.3e}")
        print(f"FINAL_SHA256 {tr.digest()}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
