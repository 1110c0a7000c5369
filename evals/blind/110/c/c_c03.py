"""Keyword-spotting distillation on 2 spawned DDP ranks.

A frozen conv teacher (never wrapped in DDP) teaches a small conv + GRU student on
synthetic log-mel features with SpecAugment-style masks. The student's conv front-end is
trained with SGD, the GRU and classifier with AdamW, each with its own cosine schedule.
The job is preempted in the middle of an epoch (at an optimizer-step boundary) and resumed
into freshly built objects, skipping the micro-batches already consumed in that epoch.
"""
import hashlib
import io
import itertools
import math
import os
from contextlib import nullcontext

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, DistributedSampler


class HParams:
    world = 2
    port = 49213
    seed = 99
    n_utts = 80
    n_mels = 20
    frames = 24
    n_kw = 5
    micro_bs = 4
    grad_accum = 2
    epochs = 3
    preempt_at_step = 7
    temperature = 2.0
    alpha = 0.7
    lr_front = 0.02
    lr_back = 2e-3


class KWSData(Dataset):
    def __init__(self, hp):
        self.hp = hp
        g = torch.Generator().manual_seed(hp.seed)
        self.labels = torch.randint(0, hp.n_kw, (hp.n_utts,), generator=g)
        templ = torch.randn(hp.n_kw, hp.n_mels, hp.frames, generator=g)
        self.feats = 0.8 * templ[self.labels] + torch.randn(hp.n_utts, hp.n_mels, hp.frames, generator=g)
        self.epoch = 0

    def set_epoch(self, e):
        self.epoch = e

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        x = self.feats[i].clone()
        g = torch.Generator().manual_seed(self.hp.seed * 1000003 + self.epoch * 1009 + i)
        f0 = int(torch.randint(0, self.hp.n_mels - 4, (1,), generator=g))
        t0 = int(torch.randint(0, self.hp.frames - 5, (1,), generator=g))
        x[f0:f0 + 4, :] = 0.0
        x[:, t0:t0 + 5] = 0.0
        return x, self.labels[i]


class Teacher(nn.Module):
    def __init__(self, hp):
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv1d(hp.n_mels, 48, 5, padding=2), nn.ReLU(),
            nn.Conv1d(48, 48, 5, padding=2), nn.ReLU(),
            nn.AdaptiveAvgPool1d(1), nn.Flatten(), nn.Linear(48, hp.n_kw))

    def forward(self, x):
        return self.net(x)


class Student(nn.Module):
    def __init__(self, hp):
        super().__init__()
        self.front = nn.Sequential(nn.Conv1d(hp.n_mels, 24, 3, padding=1), nn.ReLU())
        self.gru = nn.GRU(24, 24, batch_first=True)
        self.cls = nn.Linear(24, hp.n_kw)

    def forward(self, x):
        h = self.front(x).transpose(1, 2)
        out, _ = self.gru(h)
        return self.cls(out.mean(dim=1))


class DistillRun:
    def __init__(self, hp, rank):
        self.hp, self.rank = hp, rank
        torch.manual_seed(hp.seed)
        self.teacher = Teacher(hp).eval().requires_grad_(False)
        torch.manual_seed(hp.seed + 1)
        self.student = Student(hp)
        self.ddp = DDP(self.student)
        self.opt_front = torch.optim.SGD(self.student.front.parameters(), lr=hp.lr_front, momentum=0.9)
        back = list(self.student.gru.parameters()) + list(self.student.cls.parameters())
        self.opt_back = torch.optim.AdamW(back, lr=hp.lr_back, weight_decay=0.01)
        self.data = KWSData(hp)
        self.sampler = DistributedSampler(self.data, num_replicas=hp.world, rank=rank, shuffle=True, seed=hp.seed)
        self.loader = DataLoader(self.data, batch_size=hp.micro_bs, sampler=self.sampler, drop_last=True)
        self.steps_per_epoch = len(self.loader) // hp.grad_accum
        total = self.steps_per_epoch * hp.epochs
        cos = lambda s: 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(s, total) / total))
        self.sched = [torch.optim.lr_scheduler.LambdaLR(self.opt_front, cos),
                      torch.optim.lr_scheduler.LambdaLR(self.opt_back, cos)]
        self.step = 0

    def checkpoint(self):
        return {"student": self.student.state_dict(), "opt_front": self.opt_front.state_dict(),
                "opt_back": self.opt_back.state_dict(), "sched": [s.state_dict() for s in self.sched],
                "step": self.step}

    def restore(self, ck):
        self.student.load_state_dict(ck["student"])
        self.opt_front.load_state_dict(ck["opt_front"])
        self.opt_back.load_state_dict(ck["opt_back"])
        for s, sd in zip(self.sched, ck["sched"]):
            s.load_state_dict(sd)
        self.step = ck["step"]

    def loss_fn(self, s_logits, t_logits, y):
        T = self.hp.temperature
        kd = F.kl_div(F.log_softmax(s_logits / T, -1), F.softmax(t_logits / T, -1), reduction="batchmean") * T * T
        ce = F.cross_entropy(s_logits, y)
        return self.hp.alpha * kd + (1 - self.hp.alpha) * ce

    def train(self, stop_at=None):
        hp = self.hp
        K = hp.grad_accum
        while self.step < self.steps_per_epoch * hp.epochs:
            epoch, done_in_epoch = divmod(self.step, self.steps_per_epoch)
            self.sampler.set_epoch(epoch)
            self.data.set_epoch(epoch)
            batches = itertools.islice(iter(self.loader), done_in_epoch * K, None)
            for micro, (x, y) in enumerate(batches):
                last = (micro + 1) % K == 0
                with torch.no_grad():
                    t_logits = self.teacher(x)
                with (nullcontext() if last else self.ddp.no_sync()):
                    loss = self.loss_fn(self.ddp(x), t_logits, y) / K
                    loss.backward()
                if not last:
                    continue
                self.opt_front.step()
                self.opt_back.step()
                for s in self.sched:
                    s.step()
                self.opt_front.zero_grad(set_to_none=True)
                self.opt_back.zero_grad(set_to_none=True)
                self.step += 1
                if stop_at is not None and self.step == stop_at:
                    return
            if self.rank == 0:
                print(f"epoch {epoch} done, step {self.step}, loss {loss.item() * K:.4f}")


def worker(rank, hp):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(hp.port)
    dist.init_process_group("gloo", rank=rank, world_size=hp.world)
    torch.set_num_threads(1)

    run = DistillRun(hp, rank)
    run.train(stop_at=hp.preempt_at_step)
    blob = io.BytesIO()
    torch.save(run.checkpoint(), blob)
    if rank == 0:
        print(f"preempted at step {run.step}")
    del run

    run = DistillRun(hp, rank)
    blob.seek(0)
    run.restore(torch.load(blob))
    run.train()

    if rank == 0:
        h = hashlib.sha256()
        for _, p in run.student.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        print("FINAL_SHA256", h.hexdigest())
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(worker, args=(HParams,), nprocs=HParams.world, join=True)
