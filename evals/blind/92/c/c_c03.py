"""CTC acoustic model on 2 DDP ranks with bf16 autocast (fp32 weights and gradients),
gradient_as_bucket_view, a clip that acts, and an epoch of 11 micro-batches at K = 4
(the last window has 3). Loss = CTC summed over utterances / all-ranks target-label count
of the window, x W for DDP's average."""
import argparse
import hashlib

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

N_FEAT, N_TOK, BLANK = 20, 12, 0


class ConvCTC(nn.Module):
    def __init__(self, d=64):
        super().__init__()
        self.conv = nn.Sequential(nn.Conv1d(N_FEAT, d, 5, padding=2), nn.GELU(),
                                  nn.Conv1d(d, d, 3, padding=1), nn.GELU())
        self.ff = nn.Sequential(nn.Linear(d, d), nn.GELU())
        self.out = nn.Linear(d, N_TOK)

    def forward(self, feats):  # (B, T, F)
        h = self.conv(feats.transpose(1, 2)).transpose(1, 2)
        return self.out(self.ff(h))


def utterances(rank, epoch, i, bs):
    g = torch.Generator().manual_seed(5 + 997 * rank + 89 * epoch + i)
    T = 40
    in_lens = torch.randint(24, T + 1, (bs,), generator=g)
    tgt_lens = torch.randint(2, 9, (bs,), generator=g)
    feats = torch.randn(bs, T, N_FEAT, generator=g)
    feats[torch.arange(T)[None] >= in_lens[:, None]] = 0.0
    targets = torch.randint(1, N_TOK, (int(tgt_lens.sum()),), generator=g)
    return feats, targets, in_lens, tgt_lens


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--accum", type=int, default=4)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--micro-per-epoch", type=int, default=11)
    ap.add_argument("--bs", type=int, default=4)
    ap.add_argument("--clip", type=float, default=0.25)
    args = ap.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(3)
    model = DDP(ConvCTC(), gradient_as_bucket_view=True)
    opt = torch.optim.Adam(model.parameters(), lr=2e-3)
    updates = 0
    for epoch in range(args.epochs):
        micro = [utterances(rank, epoch, i, args.bs) for i in range(args.micro_per_epoch)]
        for s in range(0, len(micro), args.accum):
            win = micro[s:s + args.accum]
            n_lab = torch.tensor(float(sum(int(b[3].sum()) for b in win)))
            dist.all_reduce(n_lab)
            for j, (feats, targets, in_lens, tgt_lens) in enumerate(win):
                model.require_backward_grad_sync = j == len(win) - 1
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    logits = model(feats)
                logp = logits.float().log_softmax(-1).transpose(0, 1)
                loss = F.ctc_loss(logp, targets, in_lens, tgt_lens, blank=BLANK, reduction="sum", zero_infinity=True)
                (loss * world / n_lab).backward()
            gn = torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
            opt.step()
            opt.zero_grad(set_to_none=True)
            updates += 1
            if rank == 0 and updates % 4 == 0:
                print(f"update {updates} loss/label {loss.item() / int(tgt_lens.sum()):.3f} gnorm {gn:.3f}", flush=True)

    if rank == 0:
        h = hashlib.sha256()
        for _, p in model.module.named_parameters():
            h.update(p.detach().to(torch.float32).contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    torch.set_num_threads(1)
    main()
