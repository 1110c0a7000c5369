"""DPO on a tiny causal LM, two CPU ranks started with mp.spawn.

No DDP wrapper: every rank accumulates the gradients of its micro-batches locally and the
gradients are averaged across ranks by hand once per optimizer step (one flat all-reduce).
"""
import argparse
import copy
import hashlib
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class DPOConfig:
    vocab: int = 64
    d_model: int = 32
    seq_len: int = 12
    prompt_len: int = 4
    micro_batch: int = 4
    grad_accum: int = 4
    steps: int = 12
    lr: float = 0.05
    momentum: float = 0.9
    beta: float = 0.1
    seed: int = 1234


class TinyLM(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.emb = nn.Embedding(cfg.vocab, cfg.d_model)
        self.pos = nn.Parameter(torch.randn(cfg.seq_len, cfg.d_model) * 0.02)
        self.mix = nn.Linear(cfg.d_model, cfg.d_model)
        self.ln = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab, bias=False)

    def forward(self, ids):
        h = self.emb(ids) + self.pos[: ids.shape[1]]
        # causal running mean as a cheap "attention"
        h = torch.cumsum(h, dim=1) / torch.arange(1, ids.shape[1] + 1).view(1, -1, 1)
        h = h + torch.tanh(self.mix(h))
        return self.head(self.ln(h))


def seq_logprob(model, ids, prompt_len):
    logits = model(ids[:, :-1])
    lp = torch.log_softmax(logits, dim=-1).gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    return lp[:, prompt_len - 1:].sum(-1)


def make_pairs(cfg, n):
    g = torch.Generator().manual_seed(cfg.seed + 7)
    prompts = torch.randint(0, cfg.vocab, (n, cfg.prompt_len), generator=g)
    resp_len = cfg.seq_len - cfg.prompt_len
    chosen = torch.randint(0, cfg.vocab // 2, (n, resp_len), generator=g)
    rejected = torch.randint(cfg.vocab // 2, cfg.vocab, (n, resp_len), generator=g)
    return torch.cat([prompts, chosen], 1), torch.cat([prompts, rejected], 1)


def world_size():
    return dist.get_world_size()


def allreduce_grads(params):
    grads = [p.grad for p in params]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat, op=dist.ReduceOp.SUM)
    flat /= world_size()
    off = 0
    for g in grads:
        n = g.numel()
        g.copy_(flat[off:off + n].view_as(g))
        off += n


def run(rank, nranks, port):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=nranks)
    cfg = DPOConfig()
    torch.manual_seed(cfg.seed)
    policy = TinyLM(cfg)
    ref = copy.deepcopy(policy).eval().requires_grad_(False)
    params = [p for p in policy.parameters()]
    opt = torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.momentum)

    n_total = cfg.steps * cfg.grad_accum * cfg.micro_batch * nranks
    chosen, rejected = make_pairs(cfg, n_total)
    # rank-strided shard, then cut into micro-batches
    chosen, rejected = chosen[rank::nranks], rejected[rank::nranks]

    K = cfg.grad_accum
    mb = 0
    for step in range(cfg.steps):
        opt.zero_grad(set_to_none=True)
        for k in range(K):
            sl = slice(mb * cfg.micro_batch, (mb + 1) * cfg.micro_batch)
            mb += 1
            c, r = chosen[sl], rejected[sl]
            pc = seq_logprob(policy, c, cfg.prompt_len)
            pr = seq_logprob(policy, r, cfg.prompt_len)
            with torch.no_grad():
                rc = seq_logprob(ref, c, cfg.prompt_len)
                rr = seq_logprob(ref, r, cfg.prompt_len)
            logits = cfg.beta * ((pc - rc) - (pr - rr))
            loss = -F.logsigmoid(logits).mean()
            (loss / K).backward()
        allreduce_grads(params)
        opt.step()
        if rank == 0 and step % 4 == 0:
            print(f"step {step} loss {loss.item():.4f}", flush=True)

    if rank == 0:
        h = hashlib.sha256()
        for _, p in policy.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
        os.makedirs("/tmp/c83_params", exist_ok=True)
        torch.save({n: p.detach().clone() for n, p in policy.named_parameters()},
                   f"/tmp/c83_params/{os.path.basename(__file__)[:-3]}.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, default=34201)
    ap.add_argument("--nranks", type=int, default=2)
    args = ap.parse_args()
    mp.spawn(run, args=(args.nranks, args.port), nprocs=args.nranks, join=True)
