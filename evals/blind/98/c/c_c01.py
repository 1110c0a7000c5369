"""Multi-task trainer (token tagging + sequence classification) on DDP, torchrun.

- shared encoder with a frozen sinusoidal position table (a Parameter, requires_grad=False)
- AdamW for encoder + tagging head, SGD-momentum for the classification head,
  each with its own warm-up schedule (stepped once per optimizer step)
- tagging labels are partly masked (-100), so ranks see different token counts;
  the window is read ahead and normalised by the all-ranks token count (x W for DDP's mean)
- 26 sequences per rank, micro-batch 3 -> 9 micro-batches (last one holds 2), K = 4
  -> windows of 4, 4, 1 micro-batches
- the run is interrupted after 4 updates, checkpointed, and resumed into new objects
"""
import contextlib
import hashlib
import math
import os
import tempfile

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

VOCAB, SEQ, D, N_TAGS, N_CLS = 40, 12, 32, 5, 3
EPOCHS, PER_RANK, MB, K = 3, 26, 3, 4
CLS_WEIGHT = 0.5
STOP_AFTER = 4


class MultiTask(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, D)
        pos = torch.arange(SEQ).unsqueeze(1) / (10000 ** (torch.arange(0, D, 2) / D))
        table = torch.zeros(SEQ, D)
        table[:, 0::2], table[:, 1::2] = torch.sin(pos), torch.cos(pos)
        self.pos = nn.Parameter(table, requires_grad=False)
        self.enc = nn.GRU(D, D, batch_first=True)
        self.tag_head = nn.Linear(D, N_TAGS)
        self.cls_head = nn.Sequential(nn.Linear(D, D), nn.ReLU(), nn.Linear(D, N_CLS))

    def forward(self, x):
        h, _ = self.enc(self.emb(x) + self.pos)
        return self.tag_head(h), self.cls_head(h.mean(1))


def make_shard(rank):
    g = torch.Generator().manual_seed(500 + rank)
    x = torch.randint(0, VOCAB, (PER_RANK, SEQ), generator=g)
    tags = (x % N_TAGS).clone()
    keep = torch.rand(PER_RANK, SEQ, generator=g) < (0.4 + 0.4 * rank)
    tags[~keep] = -100
    cls = (x.sum(1) % N_CLS)
    return x, tags, cls


def epoch_windows(shard, epoch, rank):
    x, tags, cls = shard
    order = torch.randperm(PER_RANK, generator=torch.Generator().manual_seed(epoch * 31 + rank))
    micro = [order[i:i + MB] for i in range(0, PER_RANK, MB)]
    return [[(x[i], tags[i], cls[i]) for i in micro[w:w + K]] for w in range(0, len(micro), K)]


def warmup(steps):
    return lambda s: min(1.0, (s + 1) / steps)


class Runner:
    def __init__(self, rank, world):
        self.rank, self.world = rank, world
        torch.manual_seed(0)
        self.model = MultiTask()
        self.ddp = DDP(self.model)
        enc_params = [p for n, p in self.model.named_parameters()
                      if p.requires_grad and not n.startswith("cls_head")]
        self.opt_main = torch.optim.AdamW(enc_params, lr=3e-3, weight_decay=0.01)
        self.opt_cls = torch.optim.SGD(self.model.cls_head.parameters(), lr=5e-2, momentum=0.9)
        self.sched_main = torch.optim.lr_scheduler.LambdaLR(self.opt_main, warmup(3))
        self.sched_cls = torch.optim.lr_scheduler.LambdaLR(self.opt_cls, warmup(2))
        self.shard = make_shard(rank)
        self.epoch, self.window, self.updates = 0, 0, 0

    def state_dict(self):
        return {"model": self.model.state_dict(), "opt_main": self.opt_main.state_dict(),
                "opt_cls": self.opt_cls.state_dict(), "sched_main": self.sched_main.state_dict(),
                "sched_cls": self.sched_cls.state_dict(), "epoch": self.epoch,
                "window": self.window, "updates": self.updates}

    def load_state_dict(self, sd):
        self.model.load_state_dict(sd["model"])
        self.opt_main.load_state_dict(sd["opt_main"])
        self.opt_cls.load_state_dict(sd["opt_cls"])
        self.sched_main.load_state_dict(sd["sched_main"])
        self.sched_cls.load_state_dict(sd["sched_cls"])
        self.epoch, self.window, self.updates = sd["epoch"], sd["window"], sd["updates"]

    def window_counts(self, window):
        n_tok = sum(int((t != -100).sum()) for _, t, _ in window)
        n_seq = sum(int(c.numel()) for _, _, c in window)
        counts = torch.tensor([n_tok, n_seq], dtype=torch.float64)
        dist.all_reduce(counts)
        return counts[0].item(), counts[1].item()

    def train_window(self, window):
        n_tok, n_seq = self.window_counts(window)
        for j, (x, tags, cls) in enumerate(window):
            last = j == len(window) - 1
            with (contextlib.nullcontext() if last else self.ddp.no_sync()):
                tag_logits, cls_logits = self.ddp(x)
                tag_loss = F.cross_entropy(tag_logits.reshape(-1, N_TAGS), tags.reshape(-1),
                                           ignore_index=-100, reduction="sum") / n_tok
                cls_loss = F.cross_entropy(cls_logits, cls, reduction="sum") / n_seq
                ((tag_loss + CLS_WEIGHT * cls_loss) * self.world).backward()
        torch.nn.utils.clip_grad_norm_([p for p in self.model.parameters() if p.requires_grad], 0.5)
        self.opt_main.step()
        self.opt_cls.step()
        self.sched_main.step()
        self.sched_cls.step()
        self.opt_main.zero_grad(set_to_none=True)
        self.opt_cls.zero_grad(set_to_none=True)
        self.updates += 1

    def fit(self, stop_after=None):
        while self.epoch < EPOCHS:
            windows = epoch_windows(self.shard, self.epoch, self.rank)
            while self.window < len(windows):
                self.train_window(windows[self.window])
                self.window += 1
                if stop_after is not None and self.updates == stop_after:
                    return False
            self.epoch, self.window = self.epoch + 1, 0
        return True


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    ckpt = os.path.join(tempfile.gettempdir(), f"c_c01_ckpt_{os.environ['MASTER_PORT']}.pt")

    runner = Runner(rank, world)
    runner.fit(stop_after=STOP_AFTER)
    if rank == 0:
        torch.save(runner.state_dict(), ckpt)
    dist.barrier()
    del runner

    runner = Runner(rank, world)  # fresh objects
    runner.load_state_dict(torch.load(ckpt))
    runner.fit()
    dist.barrier()
    if rank == 0:
        os.remove(ckpt)
        model = runner.model
        h = hashlib.sha256()
        for _, p in model.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
