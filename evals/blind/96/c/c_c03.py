"""GRPO-style RL fine-tuning of a tiny policy LM, 2 DDP ranks (torchrun, gloo).

Per update: the window's K prompt batches are rolled out first (sampling through the bare
module under no_grad), then the loss is a token-level sum over the completion tokens of the
window, divided by the completion-token count of the window over all ranks (x world size,
since DDP averages).  Each rank sees 7 prompt batches per epoch with K = 3: windows 3, 3, 1.
Prompts come from a DataLoader with a worker process.  Global-norm clip at 0.15 (it acts on most updates).
"""
import argparse
import contextlib
import copy
import hashlib

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset

V, EOS, PLEN, MAXNEW = 24, 0, 5, 8


def parse():
    p = argparse.ArgumentParser()
    p.add_argument("--grad-accum", type=int, default=3)
    p.add_argument("--prompts-per-batch", type=int, default=2)
    p.add_argument("--group-size", type=int, default=4)
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--lr", type=float, default=5e-3)
    p.add_argument("--beta", type=float, default=0.04)
    p.add_argument("--max-grad-norm", type=float, default=0.15)
    p.add_argument("--seed", type=int, default=5)
    return p.parse_args()


class PromptSet(Dataset):
    def __init__(self, n, seed):
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randint(1, V, (n, PLEN), generator=g)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i]


class Policy(nn.Module):
    def __init__(self, d=32):
        super().__init__()
        self.emb = nn.Embedding(V, d)
        self.rnn = nn.GRU(d, d, batch_first=True)
        self.head = nn.Linear(d, V)

    def forward(self, ids):
        return self.head(self.rnn(self.emb(ids))[0])


@torch.no_grad()
def rollout(policy, prompts, G, gen):
    seqs = prompts.repeat_interleave(G, 0)
    done = torch.zeros(len(seqs), dtype=torch.bool)
    mask = []
    for _ in range(MAXNEW):
        probs = policy(seqs)[:, -1].softmax(-1)
        nxt = torch.multinomial(probs, 1, generator=gen).squeeze(1)
        nxt = torch.where(done, torch.full_like(nxt, EOS), nxt)
        mask.append(~done)
        done = done | (nxt == EOS)
        seqs = torch.cat([seqs, nxt[:, None]], 1)
    return seqs, torch.stack(mask, 1).float()


def reward_fn(prompts, seqs, mask, G):
    comp = seqs[:, PLEN:]
    target = prompts.repeat_interleave(G, 0)[:, :1]           # reward: echo the first prompt token
    hits = ((comp == target) & mask.bool()).float().sum(1)
    return hits - 0.1 * mask.sum(1)


def token_logps(model, seqs):
    logits = model(seqs[:, :-1])[:, PLEN - 1:]
    return torch.gather(logits.log_softmax(-1), 2, seqs[:, PLEN:, None]).squeeze(-1)


def main():
    args = parse()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(args.seed)
    policy = Policy()
    ref = copy.deepcopy(policy).requires_grad_(False)
    model = DDP(policy)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)

    n_batches = 7
    data = PromptSet(world * n_batches * args.prompts_per_batch, args.seed)
    shard = torch.utils.data.Subset(data, list(range(rank, len(data), world)))
    loader = DataLoader(shard, batch_size=args.prompts_per_batch, shuffle=True, num_workers=1,
                        generator=torch.Generator().manual_seed(args.seed), persistent_workers=True)
    gen = torch.Generator().manual_seed(args.seed + rank)
    K, G = args.grad_accum, args.group_size
    step = 0
    for epoch in range(args.epochs):
        batches = list(loader)
        for w0 in range(0, len(batches), K):
            window = []
            for prompts in batches[w0:w0 + K]:
                seqs, mask = rollout(model.module, prompts, G, gen)
                r = reward_fn(prompts, seqs, mask, G).view(-1, G)
                adv = ((r - r.mean(1, keepdim=True)) / (r.std(1, keepdim=True) + 1e-4)).view(-1)
                with torch.no_grad():
                    ref_lp = token_logps(ref, seqs)
                window.append((seqs, mask, adv, ref_lp))
            n_tok = torch.stack([m.sum() for _, m, _, _ in window]).sum()
            dist.all_reduce(n_tok)
            for j, (seqs, mask, adv, ref_lp) in enumerate(window):
                last = j == len(window) - 1
                ctx = model.no_sync() if not last else contextlib.nullcontext()
                with ctx:
                    lp = token_logps(model, seqs)
                    ratio = torch.exp(lp - lp.detach())
                    d = ref_lp - lp
                    kl = torch.exp(d) - d - 1
                    per_tok = -(ratio * adv[:, None]) + args.beta * kl
                    loss = (per_tok * mask).sum() * world / n_tok
                    loss.backward()
            gn = nn.utils.clip_grad_norm_(model.parameters(), args.max_grad_norm)
            opt.step()
            opt.zero_grad(set_to_none=True)
            step += 1
            if rank == 0:
                print(f"epoch {epoch} step {step} window {len(window)} tokens {int(n_tok)} gn {gn.item():.3f}",
                      flush=True)

    h = hashlib.sha256()
    for _, p in model.module.named_parameters():
        h.update(p.detach().float().contiguous().numpy().tobytes())
    if rank == 0:
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
