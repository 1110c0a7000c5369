"""GRPO with DAPO-style dynamic sampling on 2 spawned ranks (no DDP wrapper).

Each optimizer step consumes a window of K micro-batches per rank; every micro-batch
holds P prompts x G completions. Groups whose rewards are all equal carry no
advantage and are filtered out. The loss is token-level: the clipped surrogate summed
over all surviving completion tokens of the window on all ranks, divided by that
all-ranks token count. Gradients are summed over ranks by hand once per window.
"""
import hashlib
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F

WORLD = 2
PORT = 49213
VOCAB = 40
PROMPT_LEN = 4
MAX_COMPLETION = 8
PROMPTS_PER_MICRO = 2
GROUP = 4
K = 4
STEPS = 8
LR = 3e-3
CLIP_EPS = 0.2
MAX_GRAD_NORM = 1.0
SEED = 7


class Policy(nn.Module):
    def __init__(self, vocab=VOCAB, dim=32):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.rnn = nn.GRU(dim, dim, batch_first=True)
        self.head = nn.Linear(dim, vocab)

    def forward(self, tokens):
        h, _ = self.rnn(self.embed(tokens))
        return self.head(h)


def make_rollouts(rank, step, micro):
    """Deterministic stand-in for sampling G completions per prompt and scoring them."""
    g = torch.Generator().manual_seed(SEED * 100003 + rank * 1009 + step * 31 + micro)
    n = PROMPTS_PER_MICRO * GROUP
    prompts = torch.randint(0, VOCAB, (PROMPTS_PER_MICRO, PROMPT_LEN), generator=g)
    prompts = prompts.repeat_interleave(GROUP, dim=0)
    completions = torch.randint(0, VOCAB, (n, MAX_COMPLETION), generator=g)
    lengths = torch.randint(2, MAX_COMPLETION + 1, (n,), generator=g)
    mask = (torch.arange(MAX_COMPLETION)[None, :] < lengths[:, None]).float()
    rewards = (torch.rand(n, generator=g) < 0.5).float()
    # the verifier is often unanimous: some micro-batches have no informative group at all
    if (step + micro + rank) % 5 == 1:
        rewards = torch.full((n,), float((step + micro) % 2))
    return {"tokens": torch.cat([prompts, completions], dim=1), "mask": mask, "rewards": rewards}


def group_advantages(rewards):
    r = rewards.view(-1, GROUP)
    std = r.std(dim=1, keepdim=True)
    adv = (r - r.mean(dim=1, keepdim=True)) / (std + 1e-4)
    keep = (std > 0).expand_as(r)
    return adv.reshape(-1), keep.reshape(-1)


class GRPOTrainer:
    def __init__(self, rank):
        self.rank = rank
        torch.manual_seed(SEED)
        self.policy = Policy()
        self.optimizer = torch.optim.AdamW(self.policy.parameters(), lr=LR, weight_decay=0.0)

    def completion_logprobs(self, tokens):
        logits = self.policy(tokens[:, :-1])[:, PROMPT_LEN - 1:]
        targets = tokens[:, PROMPT_LEN:]
        return torch.gather(F.log_softmax(logits, dim=-1), 2, targets.unsqueeze(-1)).squeeze(-1)

    def window_token_count(self, window):
        n = torch.zeros(())
        for mb in window:
            _, keep = group_advantages(mb["rewards"])
            n += (mb["mask"] * keep[:, None]).sum()
        dist.all_reduce(n)
        return n

    def micro_step(self, mb, denom):
        adv, keep = group_advantages(mb["rewards"])
        if keep.sum() == 0:
            # every group in this micro-batch is unanimous: nothing to learn, skip it
            self.optimizer.zero_grad(set_to_none=True)
            return None
        logp = self.completion_logprobs(mb["tokens"])
        old_logp = logp.detach()
        ratio = torch.exp(logp - old_logp)
        surr = torch.minimum(ratio * adv[:, None],
                             ratio.clamp(1 - CLIP_EPS, 1 + CLIP_EPS) * adv[:, None])
        token_mask = mb["mask"] * keep[:, None]
        loss = -(surr * token_mask).sum() / denom
        loss.backward()
        return loss.detach()

    def sync_and_step(self):
        params = list(self.policy.parameters())
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        flat = torch.cat([p.grad.reshape(-1) for p in params])
        dist.all_reduce(flat)  # each rank's loss is already over the all-ranks count
        offset = 0
        for p in params:
            p.grad.copy_(flat[offset:offset + p.numel()].view_as(p))
            offset += p.numel()
        torch.nn.utils.clip_grad_norm_(params, MAX_GRAD_NORM)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def train(self):
        for step in range(STEPS):
            window = [make_rollouts(self.rank, step, m) for m in range(K)]
            denom = self.window_token_count(window)
            total = 0.0
            for mb in window:
                out = self.micro_step(mb, denom)
                if out is not None:
                    total += out.item()
            self.sync_and_step()
            if self.rank == 0:
                print(f"step {step} surrogate {total:+.4f} tokens {int(denom)}", flush=True)


def run(rank):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(PORT)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    torch.set_num_threads(1)
    trainer = GRPOTrainer(rank)
    trainer.train()
    if rank == 0:
        flat = torch.cat([p.detach().float().reshape(-1) for _, p in trainer.policy.named_parameters()])
        print("FINAL_SHA256", hashlib.sha256(flat.numpy().tobytes()).hexdigest(), flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(run, nprocs=WORLD, join=True)
