"""Offline DPO on a tiny causal LM, two DDP ranks, hand-written trainer.

Launch: torchrun --nproc-per-node 2 c_b01.py
"""
import copy
import hashlib
import math
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP


@dataclass
class DPOConfig:
    vocab: int = 64
    d_model: int = 48
    n_head: int = 4
    prompt_len: int = 6
    resp_len: int = 8
    pairs_per_micro: int = 4
    grad_accum: int = 4
    max_steps: int = 12
    lr: float = 3e-3
    warmup: int = 3
    beta: float = 0.1
    seed: int = 1234


class TinyLM(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        T = cfg.prompt_len + cfg.resp_len
        self.tok = nn.Embedding(cfg.vocab, cfg.d_model)
        self.pos = nn.Parameter(torch.randn(T, cfg.d_model) * 0.02)
        self.block = nn.TransformerEncoderLayer(cfg.d_model, cfg.n_head, 2 * cfg.d_model,
                                                dropout=0.0, batch_first=True)
        self.ln = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab, bias=False)
        self.register_buffer("causal", nn.Transformer.generate_square_subsequent_mask(T))

    def forward(self, ids):
        T = ids.size(1)
        h = self.tok(ids) + self.pos[:T]
        h = self.block(h, src_mask=self.causal[:T, :T], is_causal=True)
        return self.head(self.ln(h))


def make_pairs(cfg, n_pairs, gen):
    """Synthetic preference pairs: the chosen response repeats the prompt, the rejected one is noise."""
    prompts = torch.randint(0, cfg.vocab, (n_pairs, cfg.prompt_len), generator=gen)
    chosen = prompts.repeat(1, 2)[:, : cfg.resp_len]
    rejected = torch.randint(0, cfg.vocab, (n_pairs, cfg.resp_len), generator=gen)
    return prompts, chosen, rejected


def sequence_logps(model, prompts, responses):
    ids = torch.cat([prompts, responses], dim=1)
    logits = model(ids)[:, :-1]
    targets = ids[:, 1:]
    logp = torch.gather(logits.log_softmax(-1), 2, targets.unsqueeze(-1)).squeeze(-1)
    resp_mask = torch.zeros_like(logp)
    resp_mask[:, prompts.size(1) - 1:] = 1.0
    return (logp * resp_mask).sum(-1)


class DPOTrainer:
    def __init__(self, cfg, rank, world):
        self.cfg, self.rank, self.world = cfg, rank, world
        torch.manual_seed(cfg.seed)
        policy = TinyLM(cfg)
        self.ref = copy.deepcopy(policy).eval().requires_grad_(False)
        self.model = DDP(policy)
        self.policy = self.model.module  # kept around for generation / saving
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=cfg.lr, weight_decay=0.0)
        self.sched = torch.optim.lr_scheduler.LambdaLR(
            self.opt, lambda s: min(1.0, (s + 1) / cfg.warmup))
        self.gen = torch.Generator().manual_seed(cfg.seed + 100 * rank)

    def concatenated_forward(self, prompts, chosen, rejected):
        n = prompts.size(0)
        both_p = torch.cat([prompts, prompts], 0)
        both_r = torch.cat([chosen, rejected], 0)
        logps = sequence_logps(self.policy, both_p, both_r)
        with torch.no_grad():
            ref_logps = sequence_logps(self.ref, both_p, both_r)
        return logps[:n], logps[n:], ref_logps[:n], ref_logps[n:]

    def dpo_loss(self, pc, pr, rc, rr):
        logits = self.cfg.beta * ((pc - rc) - (pr - rr))
        return -F.logsigmoid(logits).mean()

    def micro_step(self, last):
        cfg = self.cfg
        prompts, chosen, rejected = make_pairs(cfg, cfg.pairs_per_micro, self.gen)
        ctx = self.model.no_sync() if not last else _null()
        with ctx:
            loss = self.dpo_loss(*self.concatenated_forward(prompts, chosen, rejected))
            (loss / cfg.grad_accum).backward()
        return loss.detach()

    def train(self):
        cfg = self.cfg
        for step in range(cfg.max_steps):
            losses = [self.micro_step(last=(k == cfg.grad_accum - 1)) for k in range(cfg.grad_accum)]
            self.opt.step()
            self.sched.step()
            self.opt.zero_grad(set_to_none=True)
            if self.rank == 0 and step % 4 == 0:
                print(f"step {step} loss {torch.stack(losses).mean().item():.4f}", flush=True)


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.use_deterministic_algorithms(True)
    trainer = DPOTrainer(DPOConfig(), rank, world)
    trainer.train()
    h = hashlib.sha256()
    for _, p in trainer.model.module.named_parameters():
        h.update(p.detach().float().contiguous().numpy().tobytes())
    if rank == 0:
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
