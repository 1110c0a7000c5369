"""Tiny CTC acoustic model (conv front-end + GRU), DDP on two spawned CPU ranks.

Loss: per-utterance CTC (sum over the utterance), averaged over the utterances of
an accumulation window. Each rank has 10 micro-batches per epoch, K = 4, so every
epoch ends in a 2-micro-batch window; the divisor follows the window length.
"""
import argparse
import hashlib
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

N_MELS, T_FRAMES, VOCAB = 20, 40, 12  # VOCAB includes blank = 0


def get_args():
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--utts-per-rank", type=int, default=40)
    p.add_argument("--micro-batch", type=int, default=4)
    p.add_argument("--accum", type=int, default=4)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--clip", type=float, default=5.0)
    p.add_argument("--port", type=int, default=49221)
    return p.parse_args()


class AcousticModel(nn.Module):
    def __init__(self, hidden=48):
        super().__init__()
        self.conv = nn.Sequential(nn.Conv1d(N_MELS, hidden, 5, padding=2), nn.ReLU(),
                                  nn.Conv1d(hidden, hidden, 3, padding=1), nn.ReLU())
        self.rnn = nn.GRU(hidden, hidden, batch_first=True, bidirectional=True)
        self.out = nn.Linear(2 * hidden, VOCAB)

    def forward(self, feats):  # feats: B x T x F
        h = self.conv(feats.transpose(1, 2)).transpose(1, 2)
        h, _ = self.rnn(h)
        return self.out(h).log_softmax(-1)  # B x T x V


def make_corpus(n, seed):
    g = torch.Generator().manual_seed(seed)
    feats = torch.randn(n, T_FRAMES, N_MELS, generator=g)
    feat_lens = torch.randint(28, T_FRAMES + 1, (n,), generator=g)
    tgt_lens = torch.randint(4, 9, (n,), generator=g)
    targets = torch.randint(1, VOCAB, (n, 8), generator=g)
    return feats, feat_lens, targets, tgt_lens


class CTCTrainer:
    def __init__(self, args, rank, world):
        self.args, self.rank, self.world = args, rank, world
        torch.manual_seed(0)
        self.model = AcousticModel()
        self.ddp = DDP(self.model)
        self.opt = torch.optim.Adam(self.model.parameters(), lr=args.lr)
        self.ctc = nn.CTCLoss(blank=0, reduction="sum", zero_infinity=True)
        self.data = make_corpus(args.utts_per_rank, seed=100 + rank)
        self.n_micro = args.utts_per_rank // args.micro_batch

    def micro_batches(self, epoch):
        g = torch.Generator().manual_seed(epoch * 7 + self.rank)
        order = torch.randperm(self.args.utts_per_rank, generator=g)
        mb = self.args.micro_batch
        for i in range(self.n_micro):
            idx = order[i * mb:(i + 1) * mb]
            yield tuple(t[idx] for t in self.data)

    def _accum_divisor(self, i):
        # how many micro-batches contribute to the current update
        window_start = (i // self.args.accum) * self.args.accum
        remaining = self.n_micro - window_start
        return min(self.args.accum, remaining)

    def _is_boundary(self, i):
        return (i + 1) % self.args.accum == 0 or i + 1 == self.n_micro

    def compute_loss(self, batch):
        feats, feat_lens, targets, tgt_lens = batch
        logp = self.ddp(feats)
        return self.ctc(logp.transpose(0, 1), targets, feat_lens, tgt_lens) / feats.size(0)

    def train(self):
        for epoch in range(self.args.epochs):
            self.opt.zero_grad(set_to_none=True)
            for i, batch in enumerate(self.micro_batches(epoch)):
                sync = self._is_boundary(i)
                if sync:
                    loss = self.compute_loss(batch) / self._accum_divisor(i)
                    loss.backward()
                else:
                    with self.ddp.no_sync():
                        loss = self.compute_loss(batch) / self._accum_divisor(i)
                        loss.backward()
                if sync:
                    torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.args.clip)
                    self.opt.step()
                    self.opt.zero_grad(set_to_none=True)


def worker(rank, world, args):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(args.port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    trainer = CTCTrainer(args, rank, world)
    trainer.train()
    if rank == 0:
        model = trainer.model
        h = hashlib.sha256()
        for _, p in model.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    args = get_args()
    mp.spawn(worker, args=(2, args), nprocs=2, join=True)
