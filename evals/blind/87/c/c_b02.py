"""GRPO-style policy training on mp.spawn ranks, gradients synchronised by hand.

Each micro-step samples G completions for a few prompts, computes group-normalised
advantages and backprops the policy-gradient loss. Every K micro-steps the trainer
clips, averages the gradients over the ranks and steps.
"""
import argparse
import hashlib
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F


def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("--world-size", type=int, default=2)
    p.add_argument("--port", type=int, default=39221)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--prompts-per-micro", type=int, default=2)
    p.add_argument("--group-size", type=int, default=4)
    p.add_argument("--completion-len", type=int, default=6)
    p.add_argument("--grad-accum", type=int, default=4)
    p.add_argument("--num-updates", type=int, default=15)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--max-grad-norm", type=float, default=0.25)
    return p.parse_args()


VOCAB, N_PROMPTS, HID = 24, 32, 48


class Policy(nn.Module):
    def __init__(self):
        super().__init__()
        self.prompt_emb = nn.Embedding(N_PROMPTS, HID)
        self.tok_emb = nn.Embedding(VOCAB, HID)
        self.gru = nn.GRUCell(HID, HID)
        self.head = nn.Linear(HID, VOCAB)

    def rollout(self, prompts, length, gen):
        """Sample completions; returns tokens and their summed log-probs."""
        h = self.prompt_emb(prompts)
        tok = torch.zeros_like(prompts)
        toks, logps = [], []
        for _ in range(length):
            h = self.gru(self.tok_emb(tok), h)
            logp = F.log_softmax(self.head(h), dim=-1)
            tok = torch.multinomial(logp.detach().exp(), 1, generator=gen).squeeze(-1)
            toks.append(tok)
            logps.append(logp.gather(-1, tok[:, None]).squeeze(-1))
        return torch.stack(toks, 1), torch.stack(logps, 1).sum(1)


def reward_fn(prompts, completions):
    target = (prompts[:, None] * 5 + torch.arange(completions.size(1))) % VOCAB
    return (completions == target).float().mean(1) + 0.1 * (completions % 2 == 0).float().mean(1)


class GRPOTrainer:
    def __init__(self, args, rank):
        self.args, self.rank = args, rank
        torch.manual_seed(args.seed)
        self.policy = Policy()
        for p in self.policy.parameters():
            dist.broadcast(p.data, 0)
        self.opt = torch.optim.Adam(self.policy.parameters(), lr=args.lr)
        self.gen = torch.Generator().manual_seed(args.seed * 31 + rank)

    def micro_step(self):
        a = self.args
        prompts = torch.randint(0, N_PROMPTS, (a.prompts_per_micro,), generator=self.gen)
        prompts = prompts.repeat_interleave(a.group_size)
        comps, logp = self.policy.rollout(prompts, a.completion_len, self.gen)
        r = reward_fn(prompts, comps).view(-1, a.group_size)
        adv = ((r - r.mean(1, keepdim=True)) / (r.std(1, keepdim=True) + 1e-4)).view(-1)
        loss = -(adv * logp).mean() / a.grad_accum
        loss.backward()
        return r.mean().item()

    def sync_gradients(self):
        ws = dist.get_world_size()
        for p in self.policy.parameters():
            if p.grad is not None:
                dist.all_reduce(p.grad)
                p.grad /= ws

    def optimizer_step(self):
        torch.nn.utils.clip_grad_norm_(self.policy.parameters(), self.args.max_grad_norm)
        self.sync_gradients()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)

    def train(self):
        for update in range(self.args.num_updates):
            rewards = [self.micro_step() for _ in range(self.args.grad_accum)]
            self.optimizer_step()
            if self.rank == 0 and update % 5 == 0:
                print(f"update {update} reward {sum(rewards) / len(rewards):.3f}", flush=True)


def worker(rank, args):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(args.port)
    dist.init_process_group("gloo", rank=rank, world_size=args.world_size)
    torch.set_num_threads(1)
    trainer = GRPOTrainer(args, rank)
    trainer.train()
    if rank == 0:
        h = hashlib.sha256()
        for _, p in trainer.policy.named_parameters():
            h.update(p.detach().to(torch.float32).contiguous().numpy().tobytes())
        print("FINAL_SHA256", h.hexdigest(), flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    args = parse_args()
    mp.spawn(worker, args=(args,), nprocs=args.world_size)
