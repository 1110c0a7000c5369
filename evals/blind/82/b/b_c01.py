"""Motif detector (1-D conv over one-hot sequences) on DeepSpeed ZeRO-1, 2 ranks.

The training loop owns the accumulation windows: the engine runs with
managed_gradient_accumulation off, so every engine.step() closes a window
(the gradients are reduced over the ranks there) whatever its length. An epoch has
10 micro-batches per rank, the last one half full, so each epoch ends with a short
window; the loss is a per-sample sum over the window's sample count on all ranks.
"""
import argparse
import hashlib

import deepspeed
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset, DistributedSampler

DS_CONFIG = {
    "train_micro_batch_size_per_gpu": 4,
    "gradient_accumulation_steps": 1,
    "managed_gradient_accumulation": False,
    "gradient_clipping": 0.5,
    "zero_optimization": {"stage": 1},
    "zero_allow_untested_optimizer": True,
    "steps_per_print": 100_000,
}
MICRO_STEPS_PER_WINDOW = 4
ALPHABET = 4
SEQ_LEN = 24


class MotifData(Dataset):
    """Label = which of three motifs is planted (or 3 = none)."""

    def __init__(self, n, seed):
        g = torch.Generator().manual_seed(seed)
        motifs = torch.randint(0, ALPHABET, (3, 5), generator=g)
        seqs = torch.randint(0, ALPHABET, (n, SEQ_LEN), generator=g)
        labels = torch.randint(0, 4, (n,), generator=g)
        for i in range(n):
            if labels[i] < 3:
                at = int(torch.randint(0, SEQ_LEN - 5, (1,), generator=g))
                seqs[i, at:at + 5] = motifs[labels[i]]
        self.x = F.one_hot(seqs, ALPHABET).float().transpose(1, 2)  # (n, C, L)
        self.y = labels

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


class MotifNet(nn.Module):
    def __init__(self, channels=32):
        super().__init__()
        self.conv1 = nn.Conv1d(ALPHABET, channels, 5, padding=2)
        self.conv2 = nn.Conv1d(channels, channels, 3, padding=1)
        self.head = nn.Linear(channels, 4)

    def forward(self, x):
        h = F.relu(self.conv1(x))
        h = F.relu(self.conv2(h))
        return self.head(h.amax(dim=-1))


def windows_of(loader, size):
    window = []
    for batch in loader:
        window.append(batch)
        if len(window) == size:
            yield window
            window = []
    if window:
        yield window


class WindowedTrainer:
    def __init__(self, args):
        deepspeed.init_distributed(dist_backend="gloo")
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.args = args
        torch.manual_seed(args.seed)
        model = MotifNet()
        optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.05)
        warmup = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda s: min(1.0, (s + 1) / args.warmup))
        self.engine, _, _, _ = deepspeed.initialize(
            model=model, optimizer=optimizer, lr_scheduler=warmup, config=DS_CONFIG)
        data = MotifData(args.n_samples, args.seed + 1)
        self.sampler = DistributedSampler(data, num_replicas=self.world, rank=self.rank,
                                          shuffle=True, seed=args.seed)
        self.loader = DataLoader(data, batch_size=DS_CONFIG["train_micro_batch_size_per_gpu"],
                                 sampler=self.sampler, drop_last=False)

    def _window_sample_count(self, window):
        n = torch.tensor(float(sum(len(y) for _, y in window)))
        dist.all_reduce(n)
        return n

    def run_window(self, window):
        n_all = self._window_sample_count(window)
        total = 0.0
        for x, y in window:
            # the engine averages the gradients over ranks: undo it with * world
            loss = F.cross_entropy(self.engine(x), y, reduction="sum") * self.world / n_all
            self.engine.backward(loss)
            total += loss.item()
        self.engine.step()
        return total

    def fit(self):
        for epoch in range(self.args.epochs):
            self.sampler.set_epoch(epoch)
            for window in windows_of(self.loader, MICRO_STEPS_PER_WINDOW):
                last = self.run_window(window)
            if self.rank == 0:
                print(f"epoch {epoch} window loss {last:.4f} updates {self.engine.global_steps}")
        h = hashlib.sha256()
        for _, p in self.engine.module.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        if self.rank == 0:
            print(f"FINAL_SHA256 {h.hexdigest()}")
        dist.barrier()


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--local_rank", type=int, default=-1)
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--lr", type=float, default=5e-3)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--n_samples", type=int, default=76)
    ap.add_argument("--seed", type=int, default=11)
    WindowedTrainer(ap.parse_args()).fit()
