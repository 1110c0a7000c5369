"""DPO by hand on two spawned ranks, no DDP wrapper.

* policy and a frozen reference copy (a small GRU LM);
* preference pairs are scored by a synthetic judge; tied pairs are masked out, so the
  number of usable pairs differs per micro-batch and per rank;
* the DPO loss of a window is the sum over its usable pairs divided by the window's
  all-ranks usable pair count; each rank backpropagates its part and the gradients
  are SUMMED across ranks with one flat all-reduce at the window boundary;
* bf16 autocast for the forward, two AdamW groups, a warm-up LambdaLR, a clip that acts.
"""
import hashlib
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

CFG = dict(vocab=24, d=32, prompt_len=5, resp_len=8, pairs_per_micro=6, accum=2, updates=10,
           beta=0.2, lr=2e-3, clip=0.15, warmup=3, seed=7)


class GRULM(nn.Module):
    def __init__(self, vocab, d):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.rnn = nn.GRU(d, d, batch_first=True)
        self.out = nn.Linear(d, vocab)

    def forward(self, ids):
        h, _ = self.rnn(self.emb(ids))
        return self.out(h)


def seq_logprob(model, ids, resp_mask, P):
    logits = model(ids[:, :-1]).float()
    lp = torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    return (lp[:, P - 1:] * resp_mask).sum(-1)


def make_pairs(gen, c):
    n, P, R = c["pairs_per_micro"], c["prompt_len"], c["resp_len"]
    prompt = torch.randint(1, c["vocab"], (n, P), generator=gen)
    a = torch.randint(1, c["vocab"], (n, R), generator=gen)
    b = torch.randint(1, c["vocab"], (n, R), generator=gen)
    la = torch.randint(3, R + 1, (n,), generator=gen)
    lb = torch.randint(3, R + 1, (n,), generator=gen)
    ar = torch.arange(R)
    ma, mb = (ar < la[:, None]).float(), (ar < lb[:, None]).float()
    # judge: prefers responses with more tokens that share parity with the prompt's first token
    par = prompt[:, :1] % 2
    sa = ((a % 2 == par).float() * ma).sum(1)
    sb = ((b % 2 == par).float() * mb).sum(1)
    a_wins = sa > sb
    chosen = torch.where(a_wins[:, None], a, b)
    rejected = torch.where(a_wins[:, None], b, a)
    mc = torch.where(a_wins[:, None], ma, mb)
    mr = torch.where(a_wins[:, None], mb, ma)
    usable = (sa != sb).float()
    return (torch.cat([prompt, chosen], 1), mc, torch.cat([prompt, rejected], 1), mr, usable)


def run(rank, world, port):
    c = CFG
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.set_num_threads(1)
    torch.manual_seed(c["seed"])
    policy = GRULM(c["vocab"], c["d"])
    reference = GRULM(c["vocab"], c["d"])
    reference.load_state_dict(policy.state_dict())
    reference.requires_grad_(False).eval()
    # a short SFT-like perturbation so policy != reference from the start
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(0.01 * torch.randn_like(p))

    params = [p for p in policy.parameters()]
    groups = [{"params": [p for p in params if p.dim() > 1], "weight_decay": 0.01},
              {"params": [p for p in params if p.dim() <= 1], "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=c["lr"])
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / c["warmup"]))
    gen = torch.Generator().manual_seed(1000 + rank)
    P = c["prompt_len"]

    for update in range(c["updates"]):
        window = [make_pairs(gen, c) for _ in range(c["accum"])]
        n_pairs = torch.stack([w[-1].sum() for w in window]).sum()
        dist.all_reduce(n_pairs)
        n_pairs = n_pairs.clamp(min=1.0)
        for ids_c, mc, ids_r, mr, usable in window:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                pc = seq_logprob(policy, ids_c, mc, P)
                pr = seq_logprob(policy, ids_r, mr, P)
                with torch.no_grad():
                    rc = seq_logprob(reference, ids_c, mc, P)
                    rr = seq_logprob(reference, ids_r, mr, P)
            margin = c["beta"] * ((pc - rc) - (pr - rr))
            loss = -(F.logsigmoid(margin) * usable).sum() / n_pairs
            loss.backward()
        # one flat all-reduce of the window's gradients (sum over ranks)
        grads = [p.grad for p in params]
        flat = _flatten_dense_tensors(grads)
        dist.all_reduce(flat)
        for g, synced in zip(grads, _unflatten_dense_tensors(flat, grads)):
            g.copy_(synced)
        gn = torch.nn.utils.clip_grad_norm_(params, c["clip"])
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        if rank == 0 and update % 3 == 0:
            print(f"update {update} pairs {int(n_pairs)} grad_norm {gn:.3f}", flush=True)

    if rank == 0:
        h = hashlib.sha256()
        for _, p in policy.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    port = int(sys.argv[sys.argv.index("--port") + 1]) if "--port" in sys.argv else 49208
    mp.spawn(run, args=(2, port), nprocs=2, join=True)
