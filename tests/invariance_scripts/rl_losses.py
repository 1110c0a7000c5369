"""Hand-written RL-style losses for `accumguard invariance`, the way TRL-like loops write them:
per-token log-probs from ``log_softmax`` + ``gather`` (no ``cross_entropy``).

``--loss grpo``: completions of uneven lengths with group-normalised advantages, per-token
loss ``-(A * logp)`` masked and summed, divided by a completion-token count:

* ``--norm window``: the tokens of the optimizer step's own K micro-batches (correct: the
  update does not depend on K);
* ``--norm generation``: the tokens of a "generation batch" of ``--generation`` (2)
  micro-batches, a count tied to micro-batches instead of the optimizer step (the TRL
  ``steps_per_generation`` != gradient accumulation mismatch): at K=1 it spans two optimizer
  steps (0.5x), at K=4 half of one (2x).

``--loss dpo``: pairs of (chosen, rejected) completions, ``-logsigmoid(beta * margin)``
averaged over the micro-batch's pairs then / K (correct with equal pairs per micro-batch),
or not divided by K (``--norm no_k``: K x the large batch's update).

Run as ``python rl_losses.py --accum K --micro-batch MB``; plain SGD (no clipping), so a
scale error shows in the update.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F  # noqa: N812

V, T = 16, 8


class Policy(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(V, 16)
        self.head = torch.nn.Linear(16, V)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.emb(x)))


def logp(policy: Policy, seq: torch.Tensor) -> torch.Tensor:
    lp = torch.log_softmax(policy(seq[:, :-1]), -1)
    return lp.gather(-1, seq[:, 1:].unsqueeze(-1)).squeeze(-1)


def data(n: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1234)
    seq = torch.randint(0, V, (n, T + 1), generator=g)
    lens = torch.randint(1, T + 1, (n,), generator=g)
    mask = (torch.arange(T)[None, :] < lens[:, None]).float()
    r = torch.randn(n, generator=g)
    adv = (r - r.mean()) / (r.std() + 1e-4)
    return seq, mask, adv


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--accum", type=int, required=True)
    p.add_argument("--micro-batch", type=int, required=True)
    p.add_argument("--loss", choices=("grpo", "dpo"), default="grpo")
    p.add_argument("--norm", choices=("window", "generation", "mean", "no_k"),
                   default="window")
    p.add_argument("--generation", type=int, default=2)
    p.add_argument("--steps", type=int, default=2)
    args = p.parse_args()
    k, mb = args.accum, args.micro_batch
    torch.manual_seed(0)
    policy, ref = Policy(), Policy()
    opt = torch.optim.SGD(policy.parameters(), lr=0.5)
    n = args.steps * k * mb
    seq, mask, adv = data(2 * n if args.loss == "dpo" else n)
    for step in range(args.steps):
        micro = [slice((step * k + i) * mb, (step * k + i + 1) * mb) for i in range(k)]
        window = float(sum(mask[s].sum() for s in micro))
        for i, s in enumerate(micro):
            if args.loss == "grpo":
                tok = -(adv[s, None] * logp(policy, seq[s]) * mask[s])
                if args.norm == "generation":  # the generation batch this micro-batch is in
                    gi = (step * k + i) // args.generation * args.generation
                    gen = slice(gi * mb, (gi + args.generation) * mb)
                    loss = tok.sum() / mask[gen].sum()
                else:
                    loss = tok.sum() / window
            else:
                c, r = slice(2 * s.start, 2 * s.stop, 2), slice(2 * s.start + 1, 2 * s.stop, 2)

                def seq_logp(m: Policy, sl: slice) -> torch.Tensor:
                    return (logp(m, seq[sl]) * mask[sl]).sum(-1)

                with torch.no_grad():
                    ref_margin = seq_logp(ref, c) - seq_logp(ref, r)
                margin = seq_logp(policy, c) - seq_logp(policy, r)
                loss = -F.logsigmoid(0.1 * (margin - ref_margin)).mean()
                if args.norm != "no_k":
                    loss = loss / k
            loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        print(f"step {step + 1} done (K={k}, micro-batch {mb})", flush=True)


if __name__ == "__main__":
    main()
