"""CTC acoustic model (conv + BiGRU) on 2 DDP ranks via torchrun, gradient accumulation.

Objective (as in ESPnet/fairseq `sentence_avg=False`): CTC negative log-likelihood summed
over the window and normalised per target token.
"""
import argparse
import contextlib
import hashlib
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

VOCAB = 8      # 0 = blank
FEATS = 12


class TinyASR(nn.Module):
    def __init__(self, hidden=24):
        super().__init__()
        self.conv = nn.Conv1d(FEATS, hidden, kernel_size=3, padding=1)
        self.rnn = nn.GRU(hidden, hidden, batch_first=True, bidirectional=True)
        self.out = nn.Linear(2 * hidden, VOCAB)

    def forward(self, feats):                      # feats: (B, T, F)
        h = torch.relu(self.conv(feats.transpose(1, 2))).transpose(1, 2)
        h, _ = self.rnn(h)
        return self.out(h).log_softmax(-1)          # (B, T, V)


def make_batch(gen, bs, t_max=30):
    in_lens = torch.randint(20, t_max + 1, (bs,), generator=gen)
    tgt_lens = torch.randint(2, 10, (bs,), generator=gen)
    feats = torch.randn(bs, t_max, FEATS, generator=gen)
    targets = torch.randint(1, VOCAB, (int(tgt_lens.sum()),), generator=gen)
    return feats, in_lens, targets, tgt_lens


def params_sha256(module):
    h = hashlib.sha256()
    for _, p in module.named_parameters():
        h.update(p.detach().to(torch.float32).contiguous().cpu().numpy().tobytes())
    return h.hexdigest()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--accum", type=int, default=4)
    ap.add_argument("--micro-bs", type=int, default=6)
    ap.add_argument("--batches-per-epoch", type=int, default=16)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--clip", type=float, default=5.0)
    args = ap.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)
    torch.manual_seed(0)

    model = DDP(TinyASR())
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    ctc = nn.CTCLoss(blank=0, reduction="sum", zero_infinity=True)

    step = 0
    for epoch in range(args.epochs):
        gen = torch.Generator().manual_seed(1000 * epoch + rank)
        batches = [make_batch(gen, args.micro_bs) for _ in range(args.batches_per_epoch)]
        for w0 in range(0, len(batches), args.accum):
            window = batches[w0:w0 + args.accum]
            # target tokens in this window over all ranks (throughput / normalisation)
            ntok = torch.tensor(float(sum(int(b[3].sum()) for b in window)))
            dist.all_reduce(ntok)
            opt.zero_grad(set_to_none=True)
            for i, (feats, in_lens, targets, tgt_lens) in enumerate(window):
                last = i == len(window) - 1
                ctx = contextlib.nullcontext() if last else model.no_sync()
                with ctx:
                    log_probs = model(feats).transpose(0, 1)          # (T, B, V)
                    loss = ctc(log_probs, targets, in_lens, tgt_lens)
                    (loss * world / ntok).backward()   # DDP averages over ranks
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
            opt.step()
            step += 1
            if rank == 0 and step % 4 == 0:
                print(f"epoch {epoch} step {step} tokens/window {int(ntok)}", flush=True)

    if rank == 0:
        if os.environ.get("PARAM_DUMP"):
            torch.save(torch.cat([p.detach().float().flatten() for p in model.module.parameters()]), os.environ["PARAM_DUMP"])
        print(f"FINAL_SHA256 {params_sha256(model.module)}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
