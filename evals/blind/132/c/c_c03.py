"""REINFORCE with a learned baseline on a toy sequence task, DDP on spawned ranks.

Each rank generates a rollout of 10 response groups per update round; the
policy is updated with K = 4 micro-batches per optimizer step, so a round's
windows are 4, 4 and 2 micro-batches. The policy-gradient term is a sum over
response tokens divided by the window's all-ranks response-token count (x world
size, as DDP averages); the value head's regression is normalised the same way.
The token embedding is frozen. Gradients are clipped once per window.
"""
import hashlib
import os
from contextlib import nullcontext

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

WORLD = 2
PORT = 49261
VOCAB, D = 16, 32
PROMPT, MAX_RESP = 4, 8
GROUPS_PER_ROUND, GROUP = 10, 4
K = 4
ROUNDS = 3
LR = 3e-3
CLIP = 0.5


class Policy(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, D)
        self.emb.weight.requires_grad_(False)
        self.rnn = nn.GRU(D, D, batch_first=True)
        self.pi = nn.Linear(D, VOCAB)
        self.v = nn.Linear(D, 1)

    def forward(self, seq):
        h, _ = self.rnn(self.emb(seq))
        return self.pi(h), self.v(h).squeeze(-1)


def reward_fn(prompt, resp, resp_mask):
    # reward: fraction of response tokens equal to (first prompt token + 1) mod VOCAB
    target = (prompt[:, :1] + 1) % VOCAB
    hit = ((resp == target) & resp_mask).float().sum(1)
    return hit / resp_mask.float().sum(1).clamp_min(1)


@torch.no_grad()
def rollout(model, gen):
    """Sample GROUP responses for each prompt, with random response lengths."""
    prompts = torch.randint(0, VOCAB, (GROUPS_PER_ROUND, PROMPT), generator=gen)
    prompts = prompts.repeat_interleave(GROUP, 0)
    seq = prompts
    for _ in range(MAX_RESP):
        logits, _ = model(seq)
        probs = F.softmax(logits[:, -1], -1)
        nxt = torch.multinomial(probs, 1, generator=gen)
        seq = torch.cat([seq, nxt], 1)
    lengths = torch.randint(2, MAX_RESP + 1, (seq.shape[0],), generator=gen)
    resp_mask = torch.arange(MAX_RESP)[None, :] < lengths[:, None]
    rewards = reward_fn(prompts, seq[:, PROMPT:], resp_mask)
    return seq, resp_mask, rewards


def micro_loss(model, seq, resp_mask, rewards):
    logits, values = model(seq[:, :-1])
    logp = torch.log_softmax(logits[:, PROMPT - 1:], -1)
    tok_logp = logp.gather(-1, seq[:, PROMPT:, None]).squeeze(-1)
    v = values[:, PROMPT - 1:]
    adv = (rewards[:, None] - v).detach()
    m = resp_mask.float()
    pg = -(tok_logp * adv * m).sum()
    vf = 0.5 * (((v - rewards[:, None]) ** 2) * m).sum()
    return pg + vf


def params_sha256(module):
    h = hashlib.sha256()
    for _, p in module.named_parameters():
        h.update(p.detach().float().contiguous().numpy().tobytes())
    return h.hexdigest()


def worker(rank):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(PORT)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    torch.manual_seed(0)
    policy = Policy()
    model = DDP(policy)
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=LR)
    gen = torch.Generator().manual_seed(100 + rank)

    for rnd in range(ROUNDS):
        seq, resp_mask, rewards = rollout(policy, gen)
        micro = list(zip(seq.split(GROUP), resp_mask.split(GROUP), rewards.split(GROUP)))
        for start in range(0, len(micro), K):
            window = micro[start:start + K]
            n_tok = torch.tensor(float(sum(int(m.sum()) for _, m, _ in window)))
            dist.all_reduce(n_tok)
            for i, (s, m, r) in enumerate(window):
                ctx = model.no_sync() if i < len(window) - 1 else nullcontext()
                with ctx:
                    loss = micro_loss(model, s, m, r) * WORLD / n_tok
                    loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
            opt.step()
            opt.zero_grad(set_to_none=True)
        if rank == 0:
            print(f"round {rnd} mean reward {rewards.mean():.3f}", flush=True)

    if rank == 0:
        print(f"FINAL_SHA256 {params_sha256(policy)}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(worker, nprocs=WORLD, join=True)
