"""Fabric distillation: a small GRU student learns from a frozen GRU teacher.

Token-level objective: hard-label CE plus alpha * KL(teacher || student), averaged over
every valid (unpadded) target token of the optimizer step's window, across all ranks.
"""
import hashlib
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
from lightning_fabric import Fabric


@dataclass
class DistillConfig:
    vocab: int = 64
    seq_len: int = 16
    micro_bs: int = 4
    accum: int = 3
    micro_per_epoch: int = 12  # per rank
    epochs: int = 3
    lr: float = 3e-3
    alpha: float = 0.7
    temperature: float = 2.0
    seed: int = 1234


class TinyLM(nn.Module):
    def __init__(self, vocab, d):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.rnn = nn.GRU(d, d, batch_first=True)
        self.head = nn.Linear(d, vocab)

    def forward(self, x):
        h, _ = self.rnn(self.emb(x))
        return self.head(h)


def make_shard(cfg, rank, world):
    g = torch.Generator().manual_seed(cfg.seed)
    n = cfg.micro_per_epoch * cfg.micro_bs * world
    x = torch.randint(0, cfg.vocab, (n, cfg.seq_len + 1), generator=g)
    lengths = torch.randint(3, cfg.seq_len + 1, (n,), generator=g)
    mask = torch.arange(cfg.seq_len)[None, :] < lengths[:, None]
    return x[rank::world], mask[rank::world]


class DistillTrainer:
    def __init__(self, cfg: DistillConfig):
        self.cfg = cfg
        self.fabric = Fabric(accelerator="cpu", devices=2, strategy="ddp")
        self.fabric.launch()
        torch.manual_seed(cfg.seed)
        teacher = TinyLM(cfg.vocab, 48)
        student = TinyLM(cfg.vocab, 32)
        teacher.requires_grad_(False).eval()
        self.teacher = teacher
        opt = torch.optim.AdamW(student.parameters(), lr=cfg.lr, weight_decay=0.01)
        self.student, self.opt = self.fabric.setup(student, opt)
        self.data, self.mask = make_shard(cfg, self.fabric.global_rank, self.fabric.world_size)

    def micro_batches(self, epoch):
        g = torch.Generator().manual_seed(self.cfg.seed + epoch)
        perm = torch.randperm(self.data.shape[0], generator=g)
        bs = self.cfg.micro_bs
        for i in range(self.cfg.micro_per_epoch):
            idx = perm[i * bs:(i + 1) * bs]
            yield self.data[idx], self.mask[idx]

    def windows(self, epoch):
        window = []
        for mb in self.micro_batches(epoch):
            window.append(mb)
            if len(window) == self.cfg.accum:
                yield window
                window = []
        if window:
            yield window

    def window_tokens(self, window):
        n_local = sum(int(m.sum()) for _, m in window)
        return self.fabric.all_reduce(torch.tensor(float(n_local)), reduce_op="sum")

    def micro_loss(self, seq, mask, n_window):
        cfg = self.cfg
        inp, tgt = seq[:, :-1], seq[:, 1:]
        s_logits = self.student(inp)
        with torch.no_grad():
            t_logits = self.teacher(inp)
        s_flat, t_flat = s_logits[mask], t_logits[mask]
        ce_sum = F.cross_entropy(s_flat, tgt[mask], reduction="sum")
        log_s = F.log_softmax(s_flat / cfg.temperature, dim=-1)
        p_t = F.softmax(t_flat / cfg.temperature, dim=-1)
        kd = F.kl_div(log_s, p_t, reduction="batchmean") * cfg.temperature ** 2
        world = self.fabric.world_size
        # DDP averages over ranks, so the window sum over all ranks' tokens is scaled by W
        return ce_sum / n_window * world + cfg.alpha * kd / cfg.accum

    def train_window(self, window):
        n_window = self.window_tokens(window)
        for j, (seq, mask) in enumerate(window):
            last = j == len(window) - 1
            with self.fabric.no_backward_sync(self.student, enabled=not last):
                loss = self.micro_loss(seq, mask, n_window)
                self.fabric.backward(loss)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)

    def fit(self):
        steps = 0
        for epoch in range(self.cfg.epochs):
            for window in self.windows(epoch):
                self.train_window(window)
                steps += 1
        return steps

    def final_sha(self):
        h = hashlib.sha256()
        for _, p in self.student.module.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        return h.hexdigest()


def main():
    torch.use_deterministic_algorithms(True)
    trainer = DistillTrainer(DistillConfig())
    trainer.fit()
    digest = trainer.final_sha()
    if trainer.fabric.global_rank == 0:
        print(f"FINAL_SHA256 {digest}", flush=True)


if __name__ == "__main__":
    main()
