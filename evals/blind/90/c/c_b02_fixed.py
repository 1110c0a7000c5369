"""Bradley-Terry reward model on 2 DDP ranks (torchrun).

Preference pairs marked as ties by the annotators are masked out of the loss, so every
micro-batch holds a different number of usable pairs. The loss of a window is the mean
over all usable pairs of the window.
"""
import hashlib
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP


@dataclass
class RMConfig:
    vocab: int = 64
    d_model: int = 32
    seq_len: int = 12
    micro_batch: int = 8
    grad_accum: int = 3
    max_steps: int = 18
    lr: float = 2e-3
    tie_rate: float = 0.35
    seed: int = 7


class RewardModel(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.emb = nn.Embedding(cfg.vocab, cfg.d_model)
        self.body = nn.Sequential(nn.Linear(cfg.d_model, 64), nn.GELU(), nn.Linear(64, 64), nn.GELU())
        self.value_head = nn.Linear(64, 1)

    def forward(self, ids):
        h = self.emb(ids).mean(dim=1)
        return self.value_head(self.body(h)).squeeze(-1)


def make_pairs(cfg, g, rank):
    chosen = torch.randint(0, cfg.vocab, (cfg.micro_batch, cfg.seq_len), generator=g)
    rejected = torch.randint(0, cfg.vocab // 2, (cfg.micro_batch, cfg.seq_len), generator=g)
    # rank 1 reads the noisier annotation shard
    rate = cfg.tie_rate + 0.3 * rank
    keep = (torch.rand(cfg.micro_batch, generator=g) > rate).float()
    return chosen, rejected, keep


def pair_loss_sum(model, chosen, rejected, keep):
    both = torch.cat([chosen, rejected], dim=0)
    r = model(both)
    rc, rr = r.chunk(2)
    return (-F.logsigmoid(rc - rr) * keep).sum()


def main():
    cfg = RMConfig()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(cfg.seed)
    torch.use_deterministic_algorithms(True)
    model = DDP(RewardModel(cfg))
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    g = torch.Generator().manual_seed(cfg.seed * 100 + rank)

    for step in range(cfg.max_steps):
        window = [make_pairs(cfg, g, rank) for _ in range(cfg.grad_accum)]
        n_pairs = torch.tensor(sum(float(w[2].sum()) for w in window))
        dist.all_reduce(n_pairs)  # usable pairs of the window on all ranks
        denom = (n_pairs / world).clamp(min=1.0)
        running = 0.0
        for i, (c, rj, keep) in enumerate(window):
            last = i == cfg.grad_accum - 1
            model.require_backward_grad_sync = last
            loss = pair_loss_sum(model, c, rj, keep) / denom
            loss.backward()
            running += loss.item()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if rank == 0 and step % 6 == 0:
            print(f"step {step} bt-loss {running:.4f}", flush=True)

    if rank == 0:
        h = hashlib.sha256()
        for _, p in model.module.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
