"""Small CTC acoustic model trained with a hand-written trainer class.

torchrun, 2 ranks, DDP + no_sync. LR is halved by ReduceLROnPlateau when the
(all-ranks) training loss stops improving; the optimizer steps every ACCUM micro-batches.
"""
import argparse
import hashlib
from contextlib import nullcontext

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

N_FEAT = 16
N_TOK = 12          # 0 = blank
T_FRAMES = 36


def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("--accum", type=int, default=3)
    p.add_argument("--micro-bs", type=int, default=4)
    p.add_argument("--updates", type=int, default=20)
    p.add_argument("--lr", type=float, default=4e-3)
    p.add_argument("--clip", type=float, default=5.0)
    p.add_argument("--seed", type=int, default=7)
    return p.parse_args()


class Acoustic(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv1d(N_FEAT, 32, 3, padding=1)
        self.rnn = nn.GRU(32, 32, batch_first=True, bidirectional=True)
        self.out = nn.Linear(64, N_TOK)

    def forward(self, feats):                        # (B, T, F)
        h = F.relu(self.conv(feats.transpose(1, 2))).transpose(1, 2)
        h, _ = self.rnn(h)
        return self.out(h).log_softmax(-1)          # (B, T, V)


class SyntheticSpeech:
    def __init__(self, rank, seed):
        self.g = torch.Generator().manual_seed(seed * 100 + rank)
        self.proto = torch.randn(N_TOK, N_FEAT, generator=torch.Generator().manual_seed(seed))

    def batch(self, bs):
        tgt_len = torch.randint(3, 7, (bs,), generator=self.g)
        targets = torch.randint(1, N_TOK, (bs, 6), generator=self.g)
        feats = 0.5 * torch.randn(bs, T_FRAMES, N_FEAT, generator=self.g)
        for b in range(bs):
            seg = T_FRAMES // int(tgt_len[b])
            for j in range(int(tgt_len[b])):
                feats[b, j * seg:(j + 1) * seg] += self.proto[targets[b, j]]
        in_len = torch.full((bs,), T_FRAMES, dtype=torch.long)
        return feats, targets, in_len, tgt_len


class WindowMeter:
    def __init__(self):
        self.total, self.n = 0.0, 0

    def update(self, v):
        self.total += v
        self.n += 1

    def mean(self):
        return self.total / max(1, self.n)

    def reset(self):
        self.total, self.n = 0.0, 0


class CTCTrainer:
    def __init__(self, args):
        self.args = args
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        torch.manual_seed(args.seed)
        self.net = Acoustic()
        self.model = DDP(self.net)
        self.opt = torch.optim.Adam(self.net.parameters(), lr=args.lr)
        self.plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(
            self.opt, mode="min", factor=0.5, patience=1, threshold=0.02)
        self.data = SyntheticSpeech(self.rank, args.seed)
        self.meter = WindowMeter()
        self.updates = 0

    def _all_mean(self, t):
        t = t.clone()
        dist.all_reduce(t)
        return (t / self.world).item()

    def training_step(self, batch, sync):
        feats, targets, in_len, tgt_len = batch
        with (nullcontext() if sync else self.model.no_sync()):
            logp = self.model(feats)
            loss = F.ctc_loss(logp.transpose(0, 1), targets, in_len, tgt_len, blank=0,
                              reduction="mean", zero_infinity=True)
            (loss / self.args.accum).backward()
        reported = self._all_mean(loss.detach())
        self.meter.update(reported)
        return reported

    def optimizer_step(self):
        torch.nn.utils.clip_grad_norm_(self.net.parameters(), self.args.clip)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        self.plateau.step(self.meter.mean())
        self.updates += 1
        if self.rank == 0 and self.updates % 5 == 0:
            print(f"update {self.updates} loss {self.meter.mean():.4f} lr {self.opt.param_groups[0]['lr']:.2e}", flush=True)
        self.meter.reset()

    def fit(self):
        K = self.args.accum
        micro = 0
        while self.updates < self.args.updates:
            batch = self.data.batch(self.args.micro_bs)
            micro += 1
            self.training_step(batch, sync=(micro % K == 0))
            if micro % K == 0:
                self.optimizer_step()

    def final_hash(self):
        h = hashlib.sha256()
        for _, p in self.net.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        return h.hexdigest()


def main():
    args = parse_args()
    dist.init_process_group("gloo")
    torch.use_deterministic_algorithms(True)
    trainer = CTCTrainer(args)
    trainer.fit()
    if trainer.rank == 0:
        print(f"FINAL_SHA256 {trainer.final_hash()}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
