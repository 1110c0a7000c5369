"""Token-level distillation, trainer split over hooks, 2 DDP ranks via torchrun.

* frozen teacher; the student's token embedding is frozen too (copied from the
  teacher), so DDP only sees the trainable part;
* variable-length sequences, padded with label -100, from a DataLoader with a
  worker process;
* the objective is the sum over every valid token of the window on all ranks of
  (KL(teacher || student) at temperature tau + CE), divided by that window's
  all-ranks token count; each rank multiplies by the world size because DDP
  averages;
* 8 micro-batches per epoch and rank with K = 3: windows of 3, 3 and 2;
* AdamW with two groups (no decay on norms/biases), a warm-up + linear decay
  LambdaLR stepped once per optimizer step, and a clip.
"""
import contextlib
import hashlib
import itertools
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset


@dataclass
class Cfg:
    vocab: int = 50
    d: int = 48
    max_len: int = 14
    samples_per_rank: int = 16
    micro_bs: int = 2
    accum: int = 3
    epochs: int = 2
    lr: float = 3e-3
    tau: float = 2.0
    clip: float = 1.0
    seed: int = 0


class SeqSet(Dataset):
    def __init__(self, cfg, rank, world, epoch):
        g = torch.Generator().manual_seed(cfg.seed + 1000 * epoch)
        n = cfg.samples_per_rank * world
        order = torch.randperm(n, generator=g).tolist()
        self.idx = order[rank::world]
        self.cfg = cfg

    def __len__(self):
        return len(self.idx)

    def __getitem__(self, i):
        j = self.idx[i]
        g = torch.Generator().manual_seed(50_000 + j)
        L = int(torch.randint(5, self.cfg.max_len + 1, (1,), generator=g))
        return torch.randint(0, self.cfg.vocab, (L,), generator=g)


def collate(seqs):
    L = max(len(s) for s in seqs)
    ids = torch.zeros(len(seqs), L, dtype=torch.long)
    labels = torch.full((len(seqs), L), -100, dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = s
        labels[i, : len(s) - 1] = s[1:]
    return ids, labels


class LM(nn.Module):
    def __init__(self, cfg, width):
        super().__init__()
        self.emb = nn.Embedding(cfg.vocab, cfg.d)
        self.up = nn.Linear(cfg.d, width)
        self.rnn = nn.GRU(width, width, batch_first=True)
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, cfg.vocab)

    def forward(self, ids):
        h, _ = self.rnn(torch.tanh(self.up(self.emb(ids))))
        return self.head(self.norm(h))


class DistillTrainer:
    def __init__(self, cfg, rank, world):
        self.cfg, self.rank, self.world = cfg, rank, world
        torch.manual_seed(cfg.seed)
        self.teacher = LM(cfg, 96).eval().requires_grad_(False)
        self.student = LM(cfg, 32)
        self.student.emb.weight.data.copy_(self.teacher.emb.weight.data)
        self.student.emb.weight.requires_grad_(False)
        self.model = DDP(self.student)
        decay = [p for n, p in self.student.named_parameters() if p.requires_grad and p.dim() > 1]
        no_decay = [p for n, p in self.student.named_parameters() if p.requires_grad and p.dim() <= 1]
        self.opt = torch.optim.AdamW([
            {"params": decay, "weight_decay": 0.05},
            {"params": no_decay, "weight_decay": 0.0},
        ], lr=cfg.lr)
        steps_per_epoch = -(-(cfg.samples_per_rank // cfg.micro_bs) // cfg.accum)
        self.total_steps = steps_per_epoch * cfg.epochs
        self.sched = torch.optim.lr_scheduler.LambdaLR(
            self.opt, lambda s: min(1.0, (s + 1) / 2) * max(0.1, 1 - s / self.total_steps))
        self.window_tokens = None

    # hooks ---------------------------------------------------------------
    def on_window_start(self, window):
        n = torch.tensor(float(sum(int((lab != -100).sum()) for _, lab in window)))
        dist.all_reduce(n)
        self.window_tokens = n
        self.opt.zero_grad(set_to_none=True)

    def training_step(self, ids, labels):
        tau = self.cfg.tau
        s_logits = self.model(ids)
        with torch.no_grad():
            t_logits = self.teacher(ids)
        valid = labels != -100
        kl = F.kl_div(F.log_softmax(s_logits / tau, -1), F.log_softmax(t_logits / tau, -1),
                      log_target=True, reduction="none").sum(-1)
        kd = (kl * valid).sum() * tau * tau
        ce = F.cross_entropy(s_logits.reshape(-1, self.cfg.vocab), labels.reshape(-1),
                             ignore_index=-100, reduction="sum")
        return (kd + ce) * self.world / self.window_tokens

    def on_before_optimizer_step(self):
        torch.nn.utils.clip_grad_norm_(self.student.parameters(), self.cfg.clip)

    def on_step_end(self):
        self.sched.step()

    # loop ----------------------------------------------------------------
    def fit(self):
        c = self.cfg
        for epoch in range(c.epochs):
            loader = DataLoader(SeqSet(c, self.rank, self.world, epoch), batch_size=c.micro_bs,
                                shuffle=False, collate_fn=collate, num_workers=1)
            it = iter(loader)
            while True:
                window = list(itertools.islice(it, c.accum))
                if not window:
                    break
                self.on_window_start(window)
                for i, (ids, labels) in enumerate(window):
                    ctx = contextlib.nullcontext() if i == len(window) - 1 else self.model.no_sync()
                    with ctx:
                        self.training_step(ids, labels).backward()
                self.on_before_optimizer_step()
                self.opt.step()
                self.on_step_end()


def param_sha(module):
    h = hashlib.sha256()
    for _, p in module.named_parameters():
        h.update(p.detach().to(torch.float32).contiguous().numpy().tobytes())
    return h.hexdigest()


def main():
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    t = DistillTrainer(Cfg(), dist.get_rank(), dist.get_world_size())
    t.fit()
    if dist.get_rank() == 0:
        print(f"FINAL_SHA256 {param_sha(t.student)}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
