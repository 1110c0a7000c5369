"""GRPO-style policy-gradient training of a tiny GRU policy, 2 ranks via mp.spawn.

Each micro-step samples a group of completions per prompt, scores them with a
rule-based reward and normalises the rewards within the group.  The update is
the mean over every completion token of the window (all micro-steps, ranks).
"""
import contextlib
import hashlib
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

VOCAB, D = 16, 48
PROMPT_LEN, GEN_LEN = 4, 6
PROMPTS_PER_MICRO, GROUP = 2, 4
ACCUM, STEPS, LR = 4, 10, 1e-2
PORT = 38605


class Policy(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, D)
        self.rnn = nn.GRU(D, D, batch_first=True)
        self.head = nn.Linear(D, VOCAB)

    def forward(self, ids, h=None):
        y, h = self.rnn(self.emb(ids), h)
        return self.head(y), h


def reward_fn(prompts, completions):
    # reward: how often the completion repeats the first prompt token
    target = prompts[:, :1]
    return (completions == target).float().mean(1)


class GRPOTrainer:
    def __init__(self, rank):
        self.rank = rank
        torch.manual_seed(0)
        self.policy = DDP(Policy())
        self.optimizer = torch.optim.Adam(self.policy.parameters(), lr=LR)
        self.gen = torch.Generator().manual_seed(77 + rank)

    @torch.no_grad()
    def rollout(self, prompts):
        # generation holds a lot of activations; drop gradient buffers first
        self.optimizer.zero_grad(set_to_none=True)
        net = self.policy.module
        ids = prompts.repeat_interleave(GROUP, 0)
        logits, h = net(ids)
        out = []
        for _ in range(GEN_LEN):
            probs = F.softmax(logits[:, -1], -1)
            nxt = torch.multinomial(probs, 1, generator=self.gen)
            out.append(nxt)
            logits, h = net(nxt, h)
        return ids, torch.cat(out, 1)

    def advantages(self, prompts, completions):
        r = reward_fn(prompts.repeat_interleave(GROUP, 0), completions).view(-1, GROUP)
        adv = (r - r.mean(1, keepdim=True)) / (r.std(1, keepdim=True) + 1e-4)
        return adv.view(-1)

    def policy_loss(self, ids, completions, adv):
        full = torch.cat([ids, completions], 1)
        logits, _ = self.policy(full[:, :-1])
        logp = torch.log_softmax(logits[:, PROMPT_LEN - 1:], -1)
        tok_logp = logp.gather(-1, completions.unsqueeze(-1)).squeeze(-1)
        return -(adv.unsqueeze(1) * tok_logp).mean()

    def train(self):
        for step in range(STEPS):
            for micro in range(ACCUM):
                prompts = torch.randint(0, VOCAB, (PROMPTS_PER_MICRO, PROMPT_LEN), generator=self.gen)
                ids, comp = self.rollout(prompts)
                adv = self.advantages(prompts, comp)
                sync = micro == ACCUM - 1
                with (contextlib.nullcontext() if sync else self.policy.no_sync()):
                    loss = self.policy_loss(ids, comp, adv) / ACCUM
                    loss.backward()
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)


def run(rank, world):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(PORT)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    t = GRPOTrainer(rank)
    t.train()
    if rank == 0:
        h = hashlib.sha256()
        for _, p in t.policy.module.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        print("FINAL_SHA256", h.hexdigest(), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(run, args=(2,), nprocs=2, join=True)
