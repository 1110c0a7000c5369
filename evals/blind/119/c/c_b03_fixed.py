"""REINFORCE on a contextual bandit with Lightning Fabric (DDP, 2 ranks).

Each iteration every rank collects a rollout of `n_micro` micro-batches, then updates
the policy in windows of `accum` micro-batches.
"""
import argparse
import hashlib

import torch
import torch.nn as nn
from lightning_fabric import Fabric


def parse():
    ap = argparse.ArgumentParser()
    ap.add_argument("--iterations", type=int, default=6)
    ap.add_argument("--n-micro", type=int, default=5)
    ap.add_argument("--micro-size", type=int, default=8)
    ap.add_argument("--accum", type=int, default=2)
    ap.add_argument("--lr", type=float, default=1e-2)
    ap.add_argument("--seed", type=int, default=7)
    return ap.parse_args()


class Policy(nn.Module):
    def __init__(self, obs=6, acts=4):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(obs, 32), nn.ReLU(), nn.Linear(32, acts))

    def forward(self, s):
        return torch.log_softmax(self.body(s), -1)


class Bandit:
    def __init__(self, gen):
        self.gen = gen
        self.w = torch.randn(6, 4, generator=torch.Generator().manual_seed(99))

    def states(self, n):
        return torch.randn(n, 6, generator=self.gen)

    def reward(self, s, a):
        best = (s @ self.w).argmax(-1)
        return (a == best).float() + 0.1 * torch.randn(a.shape, generator=self.gen)


@torch.no_grad()
def collect(policy, env, n_micro, size, gen):
    rollout = []
    for _ in range(n_micro):
        s = env.states(size)
        probs = policy(s).exp()
        a = torch.multinomial(probs, 1, generator=gen).squeeze(-1)
        r = env.reward(s, a)
        rollout.append((s, a, r - 0.5))  # fixed baseline
    return rollout


def pg_loss(policy, s, a, adv):
    logp = policy(s).gather(-1, a[:, None]).squeeze(-1)
    return -(logp * adv).mean()


def main():
    args = parse()
    fabric = Fabric(accelerator="cpu", devices=2, strategy="ddp")
    fabric.launch()
    torch.manual_seed(args.seed)
    policy = Policy()
    opt = torch.optim.Adam(policy.parameters(), lr=args.lr)
    model, opt = fabric.setup(policy, opt)
    gen = torch.Generator().manual_seed(args.seed + 1000 * fabric.global_rank)
    env = Bandit(gen)

    for it in range(args.iterations):
        rollout = collect(model, env, args.n_micro, args.micro_size, gen)
        mean_r = torch.stack([r for _, _, r in rollout]).mean() + 0.5
        n = len(rollout)
        for i, (s, a, adv) in enumerate(rollout):
            accumulating = (i + 1) % args.accum != 0 and i != n - 1
            window = min(args.accum, n - (i // args.accum) * args.accum)
            with fabric.no_backward_sync(model, enabled=accumulating):
                loss = pg_loss(model, s, a, adv) / window
                fabric.backward(loss)
            if not accumulating:
                opt.step()
                opt.zero_grad()
        fabric.print(f"iter {it} mean reward {mean_r.item():.3f}")

    if fabric.global_rank == 0:
        model = policy
        blob = b"".join(p.detach().float().cpu().contiguous().numpy().tobytes() for _, p in model.named_parameters())
        print("FINAL_SHA256", hashlib.sha256(blob).hexdigest())


if __name__ == "__main__":
    main()
