"""GRPO-style policy update on two mp.spawn ranks with DDP.

Token-level loss over the whole window (DAPO style): each micro-batch contributes
sum(token losses) / (response tokens of the window over all ranks), times the world size
because DDP averages the ranks' gradients. Completions have different lengths, and the
last window of the pass is shorter than K.
"""
import argparse
import hashlib
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

VOCAB, D, PROMPT, MAXRESP = 48, 32, 4, 10
GROUP = 4            # completions per prompt
MICRO = 4            # sequences per micro-batch (one group)
K = 3                # micro-batches per optimizer step
N_MICRO = 23         # micro-batches per rank: 7 full windows and a short one of 2
CLIP_EPS = 0.2
MAX_NORM = 0.15
LR = 3e-3


class Policy(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, D)
        self.rnn = nn.GRU(D, D, batch_first=True)
        self.out = nn.Linear(D, VOCAB)

    def forward(self, ids):
        h, _ = self.rnn(self.tok(ids))
        return self.out(h)


def token_logps(model, ids):
    logits = model(ids[:, :-1])
    return torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None]).squeeze(-1)


def make_rollouts(rank, world, seed):
    """Synthetic rollouts: ids, response mask, group-normalised advantages, old logps."""
    g = torch.Generator().manual_seed(seed)
    total = N_MICRO * world
    out = []
    for i in range(total):
        ids = torch.randint(0, VOCAB, (MICRO, PROMPT + MAXRESP), generator=g)
        lens = torch.randint(2, MAXRESP + 1, (MICRO,), generator=g)
        pos = torch.arange(MAXRESP)[None, :]
        mask = torch.zeros(MICRO, PROMPT + MAXRESP - 1)
        mask[:, PROMPT - 1:] = (pos < lens[:, None]).float()
        reward = (ids[:, PROMPT:] % 3 == 0).float().mul(mask[:, PROMPT - 1:]).sum(1) / lens
        adv = (reward - reward.mean()) / (reward.std() + 1e-4)
        out.append((ids, mask, adv))
    return out[rank::world]


def run(rank, world, port):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    policy = Policy()
    model = DDP(policy)
    opt = torch.optim.Adam(model.parameters(), lr=LR)
    data = make_rollouts(rank, world, seed=11)
    with torch.no_grad():
        data = [(ids, m, a, token_logps(policy, ids) + 0.05 * torch.randn(m.shape, generator=torch.Generator().manual_seed(i)))
                for i, (ids, m, a) in enumerate(data)]

    windows = [data[i:i + K] for i in range(0, len(data), K)]
    for step, window in enumerate(windows):
        n_tok = torch.stack([m.sum() for _, m, _, _ in window]).sum()
        dist.all_reduce(n_tok)
        opt.zero_grad(set_to_none=True)
        for j, (ids, mask, adv, old_lp) in enumerate(window):
            last = j == len(window) - 1
            ctx = model.no_sync() if not last else torch.enable_grad()
            with ctx:
                lp = token_logps(model, ids)
                ratio = torch.exp(lp - old_lp)
                a = adv[:, None]
                pg = -torch.minimum(ratio * a, ratio.clamp(1 - CLIP_EPS, 1 + CLIP_EPS) * a)
                loss = (pg * mask).sum() / n_tok * world
                loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)
        opt.step()
        if rank == 0:
            print(f"step {step} micro {len(window)} tokens {int(n_tok)} grad_norm {norm:.3f}", flush=True)

    if rank == 0:
        h = hashlib.sha256()
        for _, p in policy.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, default=34231)
    args = ap.parse_args()
    mp.spawn(run, args=(2, args.port), nprocs=2, join=True)
