"""DPO with an SFT (NLL on the chosen answer) regulariser, 2 DDP ranks via torchrun.

Policy and frozen reference are tiny GRU language models with random weights;
preference pairs are synthetic (chosen answers follow an arithmetic rule,
rejected ones are noisy).
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


def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("--vocab", type=int, default=40)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--prompt-len", type=int, default=6)
    p.add_argument("--resp-len", type=int, default=6)
    p.add_argument("--per-device-pairs", type=int, default=4)
    p.add_argument("--grad-accum", type=int, default=4)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--beta", type=float, default=0.1)
    p.add_argument("--sft-weight", type=float, default=0.5)
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args()


class GRULM(nn.Module):
    def __init__(self, vocab, hidden):
        super().__init__()
        self.emb = nn.Embedding(vocab, hidden)
        self.rnn = nn.GRU(hidden, hidden, batch_first=True)
        self.out = nn.Linear(hidden, vocab)

    def forward(self, ids):
        h, _ = self.rnn(self.emb(ids))
        return self.out(h)


def make_pairs(args, gen):
    n, P, R, V = args.per_device_pairs, args.prompt_len, args.resp_len, args.vocab
    a = torch.randint(0, V, (n, 1), generator=gen)
    d = torch.randint(1, 3, (n, 1), generator=gen)
    prompt = (a + d * torch.arange(P)) % V
    chosen = (a + d * torch.arange(P, P + R)) % V
    rejected = torch.randint(0, V, (n, R), generator=gen)
    return torch.cat([prompt, chosen], 1), torch.cat([prompt, rejected], 1)


def response_logps(model, ids, prompt_len):
    """Per-sequence sum and per-token log-probs of the response tokens."""
    logits = model(ids[:, :-1])
    lp = torch.log_softmax(logits.float(), -1).gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    tok = lp[:, prompt_len - 1:]
    return tok.sum(-1), tok


class DPOTrainer:
    def __init__(self, args, rank):
        self.args = args
        torch.manual_seed(args.seed)
        base = GRULM(args.vocab, args.hidden)
        self.ref = copy.deepcopy(base).eval().requires_grad_(False)
        self.policy = base
        self.ddp = DDP(self.policy)
        self.opt = torch.optim.AdamW(self.policy.parameters(), lr=args.lr, weight_decay=0.0)
        self.gen = torch.Generator().manual_seed(args.seed * 100 + 7 + rank)

    def compute_loss(self, chosen, rejected):
        a = self.args
        ids = torch.cat([chosen, rejected], 0)
        pol_sum, pol_tok = response_logps(self.ddp, ids, a.prompt_len)
        with torch.no_grad():
            ref_sum, _ = response_logps(self.ref, ids, a.prompt_len)
        n = chosen.size(0)
        margin = (pol_sum[:n] - ref_sum[:n]) - (pol_sum[n:] - ref_sum[n:])
        dpo_loss = -F.logsigmoid(a.beta * margin).mean()
        nll_loss = -pol_tok[:n].mean()
        return dpo_loss + a.sft_weight * nll_loss / a.grad_accum

    def train(self):
        a = self.args
        for _ in range(a.steps):
            self.opt.zero_grad(set_to_none=True)
            for k in range(a.grad_accum):
                chosen, rejected = make_pairs(a, self.gen)
                last = k == a.grad_accum - 1
                with (contextlib.nullcontext() if last else self.ddp.no_sync()):
                    loss = self.compute_loss(chosen, rejected)
                    loss.backward()
            self.opt.step()


def param_sha(module):
    h = hashlib.sha256()
    for _, p in module.named_parameters():
        h.update(p.detach().to(torch.float32).contiguous().numpy().tobytes())
    return h.hexdigest()


def main():
    args = parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    trainer = DPOTrainer(args, dist.get_rank())
    trainer.train()
    if dist.get_rank() == 0:
        print(f"FINAL_SHA256 {param_sha(trainer.policy)}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
