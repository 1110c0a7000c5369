"""Token-level REINFORCE (GRPO-flavoured) on Lightning Fabric.

Each rollout gives every rank 8 prompt/response pairs. Responses have ragged
lengths, so the policy-gradient loss is a sum over response tokens normalised by
the number of response tokens in the whole optimizer window across all ranks.
"""
import argparse
import hashlib

import torch
import torch.nn as nn
import torch.nn.functional as F
from lightning_fabric import Fabric, seed_everything


VOCAB, PROMPT_LEN, MAX_RESP = 20, 4, 8


class TinyPolicy(nn.Module):
    def __init__(self, d=32):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, d)
        self.rnn = nn.GRU(d, d, batch_first=True)
        self.head = nn.Linear(d, VOCAB)

    def forward(self, tokens):
        h, _ = self.rnn(self.emb(tokens))
        return self.head(h)


def make_rollout(step, rank, n_pairs, gen_seed=99):
    """Synthetic rollout: prompt + sampled response, a response mask and a group-normalised advantage."""
    g = torch.Generator().manual_seed(gen_seed + 1000 * step + rank)
    seq = torch.randint(0, VOCAB, (n_pairs, PROMPT_LEN + MAX_RESP), generator=g)
    resp_len = torch.randint(1, MAX_RESP + 1, (n_pairs,), generator=g)
    pos = torch.arange(PROMPT_LEN + MAX_RESP)
    mask = (pos >= PROMPT_LEN) & (pos < PROMPT_LEN + resp_len[:, None])
    reward = torch.rand(n_pairs, generator=g)
    adv = (reward - reward.mean()) / (reward.std() + 1e-6)
    return seq, mask, adv


def token_pg_sum(policy, seq, mask, adv):
    logits = policy(seq[:, :-1])
    logp = torch.log_softmax(logits.float(), -1).gather(-1, seq[:, 1:, None]).squeeze(-1)
    m = mask[:, 1:].float()
    return -(logp * adv[:, None] * m).sum()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rollouts", type=int, default=6)
    ap.add_argument("--pairs-per-rank", type=int, default=8)
    ap.add_argument("--micro-bs", type=int, default=2)
    ap.add_argument("--grad-accum", type=int, default=2)
    ap.add_argument("--lr", type=float, default=0.05)
    args = ap.parse_args()

    fabric = Fabric(accelerator="cpu", devices=2, strategy="ddp")
    fabric.launch()
    seed_everything(2024)

    policy = TinyPolicy()
    opt = torch.optim.SGD(policy.parameters(), lr=args.lr, momentum=0.9)
    policy, opt = fabric.setup(policy, opt)

    K = args.grad_accum
    for step in range(args.rollouts):
        seq, mask, adv = make_rollout(step, fabric.global_rank, args.pairs_per_rank)
        micro = list(zip(seq.split(args.micro_bs), mask.split(args.micro_bs), adv.split(args.micro_bs)))
        for w in range(0, len(micro), K):
            window = micro[w:w + K]
            n_tok = sum(mb[1][:, 1:].sum() for mb in window).float()
            n_tok = fabric.all_reduce(n_tok)  # response tokens in this window, all ranks
            for j, (s, m, a) in enumerate(window):
                with fabric.no_backward_sync(policy, enabled=j < len(window) - 1):
                    loss = token_pg_sum(policy, s, m, a) / n_tok * fabric.world_size
                    fabric.backward(loss)
            opt.step()
            opt.zero_grad(set_to_none=True)

    if fabric.global_rank == 0:
        h = hashlib.sha256()
        for _, p in policy.module.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        print("FINAL_SHA256", h.hexdigest(), flush=True)
        torch.save({n: p.detach().clone() for n, p in policy.module.named_parameters()},
                   "tmp_scratch/" + __file__.split("/")[-1] + ".pt")


if __name__ == "__main__":
    main()
