"""Tiny CTC acoustic model, DDP on 2 ranks, dynamic (frame-budget) batching.

Utterances are sorted by length and packed into micro-batches under a frame
budget, so micro-batches hold different numbers of utterances. The objective is
the per-utterance CTC loss averaged over all utterances of an optimizer step.
"""
import os
import hashlib
import argparse
import contextlib
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

VOCAB = 12  # 0 = blank
FEAT = 20


class AcousticModel(nn.Module):
    def __init__(self, hid=48):
        super().__init__()
        self.conv = nn.Conv1d(FEAT, hid, kernel_size=3, padding=1)
        self.rnn = nn.GRU(hid, hid, batch_first=True)
        self.out = nn.Linear(hid, VOCAB)

    def forward(self, feats):  # (B, T, FEAT)
        h = F.relu(self.conv(feats.transpose(1, 2))).transpose(1, 2)
        h, _ = self.rnn(h)
        return self.out(h).log_softmax(-1)


def make_corpus(n, seed):
    g = torch.Generator().manual_seed(seed)
    utts = []
    for _ in range(n):
        T = int(torch.randint(12, 60, (1,), generator=g))
        L = int(torch.randint(2, max(3, T // 5), (1,), generator=g))
        tgt = torch.randint(1, VOCAB, (L,), generator=g)
        feats = torch.randn(T, FEAT, generator=g)
        feats[:, :VOCAB] += 0.8 * F.one_hot(tgt.repeat_interleave(T // L + 1)[:T], VOCAB).float()
        utts.append((feats, tgt))
    return utts


def frame_budget_batches(utts, max_frames):
    utts = sorted(utts, key=lambda u: u[0].shape[0])
    batches, cur, longest = [], [], 0
    for u in utts:
        longest_new = max(longest, u[0].shape[0])
        if cur and longest_new * (len(cur) + 1) > max_frames:
            batches.append(cur)
            cur, longest_new = [], u[0].shape[0]
        cur.append(u)
        longest = longest_new
    if cur:
        batches.append(cur)
    return batches


def collate(batch):
    feats = nn.utils.rnn.pad_sequence([b[0] for b in batch], batch_first=True)
    in_lens = torch.tensor([b[0].shape[0] for b in batch])
    tgts = torch.cat([b[1] for b in batch])
    tgt_lens = torch.tensor([b[1].shape[0] for b in batch])
    return feats, in_lens, tgts, tgt_lens


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--accum", type=int, default=4)
    ap.add_argument("--max-frames", type=int, default=240)
    ap.add_argument("--lr", type=float, default=3e-3)
    args = ap.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = DDP(AcousticModel())
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    ctc = nn.CTCLoss(blank=0, reduction="sum", zero_infinity=True)

    batches = frame_budget_batches(make_corpus(90, seed=11 + rank), args.max_frames)
    n_windows = min(len(batches) // args.accum, 8)
    t = torch.tensor([n_windows])
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    n_windows = int(t)
    perm = torch.randperm(len(batches), generator=torch.Generator().manual_seed(5 + rank)).tolist()
    batches = [batches[i] for i in perm]

    for step in range(n_windows):
        window = [collate(b) for b in batches[step * args.accum:(step + 1) * args.accum]]
        opt.zero_grad(set_to_none=True)
        for i, (feats, in_lens, tgts, tgt_lens) in enumerate(window):
            last = i == len(window) - 1
            ctx = contextlib.nullcontext() if last else model.no_sync()
            with ctx:
                logp = model(feats).transpose(0, 1)  # (T, B, V)
                loss = ctc(logp, tgts, in_lens, tgt_lens) / feats.shape[0]
                (loss / args.accum).backward()
        opt.step()
        if rank == 0:
            print(f"step {step} utts/mb {[w[0].shape[0] for w in window]} loss {loss.item():.3f}", flush=True)

    if os.environ.get("PARAM_DUMP") and rank == 0:
        torch.save(torch.cat([p.detach().flatten() for p in model.module.parameters()]), os.environ["PARAM_DUMP"])
    h = hashlib.sha256()
    for _, p in model.module.named_parameters():
        h.update(p.detach().float().contiguous().numpy().tobytes())
    if rank == 0:
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
