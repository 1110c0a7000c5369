"""GRPO-style policy optimisation on spawned ranks without DDP.

Each rank owns a full copy of the policy. Gradients are summed over ranks with one
flat all-reduce per optimizer step; the loss of every micro-batch is a token sum
divided by the response-token count of the whole window on all ranks, so the SUM
gives the large-batch token mean. A rollout holds 5 micro-batches per rank and
K = 2, so the windows are 2-2-1. A frozen reference model adds a per-token KL."""
import copy
import hashlib
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn

WORLD = 2
PORT = 49209
VOCAB, P_LEN, R_MAX = 24, 3, 7
K = 2
MICRO_BS = 2
N_MICRO = 5
ROLLOUTS = 4
BETA = 0.05


class Policy(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, 32)
        self.mix = nn.Conv1d(32, 32, kernel_size=3, padding=2)  # causal via left trim
        self.out = nn.Linear(32, VOCAB)

    def forward(self, tok):
        h = self.emb(tok).transpose(1, 2)
        h = torch.relu(self.mix(h)[..., : tok.size(1)]).transpose(1, 2)
        return self.out(h)


def rollout(it, rank):
    g = torch.Generator().manual_seed(31 + 97 * it + 7 * rank)
    n = MICRO_BS * N_MICRO
    seq = torch.randint(0, VOCAB, (n, P_LEN + R_MAX), generator=g)
    rlen = torch.randint(1, R_MAX + 1, (n,), generator=g)
    pos = torch.arange(P_LEN + R_MAX)
    mask = ((pos >= P_LEN) & (pos < P_LEN + rlen[:, None]))[:, 1:].float()
    rewards = torch.rand(n // 2, 2, generator=g)  # groups of 2 completions
    adv = ((rewards - rewards.mean(1, keepdim=True)) / (rewards.std(1, keepdim=True) + 1e-4)).reshape(-1)
    return seq, mask, adv


def token_logp(model, seq):
    lp = torch.log_softmax(model(seq[:, :-1]), -1)
    return lp.gather(-1, seq[:, 1:, None]).squeeze(-1)


def worker(rank):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{PORT}", rank=rank, world_size=WORLD)
    torch.manual_seed(5)
    policy = Policy()
    ref = copy.deepcopy(policy).requires_grad_(False).eval()
    opt = torch.optim.AdamW(policy.parameters(), lr=1e-2, weight_decay=0.0)
    params = [p for p in policy.parameters() if p.requires_grad]

    for it in range(ROLLOUTS):
        seq, mask, adv = rollout(it, rank)
        micro = list(zip(seq.split(MICRO_BS), mask.split(MICRO_BS), adv.split(MICRO_BS)))
        for w0 in range(0, N_MICRO, K):
            window = micro[w0:w0 + K]
            n_tok = torch.stack([m.sum() for _, m, _ in window]).sum()
            dist.all_reduce(n_tok)  # SUM: response tokens of this window on all ranks
            for s, m, a in window:
                logp = token_logp(policy, s)
                with torch.no_grad():
                    ref_logp = token_logp(ref, s)
                ratio = torch.exp(logp - logp.detach())
                kl = torch.exp(ref_logp - logp) - (ref_logp - logp) - 1
                per_tok = -(ratio * a[:, None]) + BETA * kl
                ((per_tok * m).sum() / n_tok).backward()
            flat = torch.cat([p.grad.reshape(-1) for p in params])
            dist.all_reduce(flat)  # SUM over ranks
            off = 0
            for p in params:
                p.grad.copy_(flat[off:off + p.numel()].view_as(p))
                off += p.numel()
            torch.nn.utils.clip_grad_norm_(params, 0.5)
            opt.step()
            opt.zero_grad(set_to_none=True)

    if rank == 0:
        h = hashlib.sha256()
        for _, p in policy.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        print("FINAL_SHA256", h.hexdigest(), flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    torch.set_num_threads(1)
    mp.spawn(worker, nprocs=WORLD)
