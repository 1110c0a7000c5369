"""Pairwise reward model (Bradley-Terry) trained on 2 spawned ranks.

Memory-lean recipe: the working copy of the model is kept in bfloat16, the optimizer
owns fp32 master weights.  Gradients are averaged over ranks by hand (one flat
all-reduce per optimizer step).
"""
import hashlib
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class RMConfig:
    vocab: int = 96
    d_model: int = 48
    n_heads: int = 4
    seq_len: int = 20
    micro_batch: int = 8
    grad_accum: int = 4
    max_steps: int = 20
    lr: float = 3e-3
    weight_decay: float = 0.01
    seed: int = 1234
    port: int = 49231
    world_size: int = 2


class RewardModel(nn.Module):
    def __init__(self, cfg: RMConfig):
        super().__init__()
        self.tok = nn.Embedding(cfg.vocab, cfg.d_model)
        self.pos = nn.Parameter(torch.randn(cfg.seq_len, cfg.d_model) * 0.02)
        self.block = nn.TransformerEncoderLayer(cfg.d_model, cfg.n_heads, 2 * cfg.d_model,
                                                dropout=0.0, batch_first=True)
        self.norm = nn.LayerNorm(cfg.d_model)
        self.value = nn.Linear(cfg.d_model, 1)

    def forward(self, ids):
        h = self.tok(ids) + self.pos[: ids.shape[1]]
        h = self.block(h)
        return self.value(self.norm(h[:, -1])).squeeze(-1)


def preference_batch(cfg, gen):
    chosen = torch.randint(0, cfg.vocab, (cfg.micro_batch, cfg.seq_len), generator=gen)
    rejected = torch.randint(0, cfg.vocab, (cfg.micro_batch, cfg.seq_len), generator=gen)
    # "better" answers use more low token ids: gives the reward model something to learn
    chosen = torch.where(torch.rand(chosen.shape, generator=gen) < 0.5, chosen % 16, chosen)
    return chosen, rejected


class MasterWeights:
    """fp32 master copy of a bf16 model (the optimizer steps on the masters)."""

    def __init__(self, model):
        self.model = model
        self.masters = [p.detach().float().clone().requires_grad_(True) for p in model.parameters()]

    def stash_grads(self):
        for m, p in zip(self.masters, self.model.parameters()):
            if p.grad is None:
                continue
            if m.grad is None:
                m.grad = p.grad.float()
            else:
                m.grad.add_(p.grad.float())
            p.grad = None

    def allreduce_grads(self, world_size):
        grads = [m.grad for m in self.masters]
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat)
        flat.div_(world_size)
        off = 0
        for g in grads:
            n = g.numel()
            g.copy_(flat[off:off + n].view_as(g))
            off += n

    def push_to_model(self):
        with torch.no_grad():
            for m, p in zip(self.masters, self.model.parameters()):
                p.copy_(m.to(p.dtype))

    def zero_grad(self):
        for m in self.masters:
            m.grad = None


def worker(rank, cfg: RMConfig):
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(cfg.port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=cfg.world_size)
    torch.manual_seed(cfg.seed)
    torch.use_deterministic_algorithms(True)

    model = RewardModel(cfg).to(torch.bfloat16)
    mw = MasterWeights(model)
    opt = torch.optim.AdamW(mw.masters, lr=cfg.lr, weight_decay=cfg.weight_decay)

    gen = torch.Generator().manual_seed(cfg.seed + 100 * rank)
    micro = 0
    step = 0
    while step < cfg.max_steps:
        chosen, rejected = preference_batch(cfg, gen)
        r_c = model(chosen).float()
        r_r = model(rejected).float()
        loss = -F.logsigmoid(r_c - r_r).mean() / cfg.grad_accum
        loss.backward()
        micro += 1
        if micro % cfg.grad_accum == 0:
            mw.stash_grads()
            mw.allreduce_grads(cfg.world_size)
            opt.step()
            mw.zero_grad()
            mw.push_to_model()
            step += 1
            if rank == 0 and step % 5 == 0:
                print(f"step {step} loss {loss.item() * cfg.grad_accum:.4f}", flush=True)

    if rank == 0:
        h = hashlib.sha256()
        for (name, _), m in zip(model.named_parameters(), mw.masters):
            h.update(m.detach().float().contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
        if os.environ.get("DUMP_PARAMS"):
            torch.save([m.detach().clone() for m in mw.masters], os.environ["DUMP_PARAMS"])
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    cfg = RMConfig()
    mp.spawn(worker, args=(cfg,), nprocs=cfg.world_size, join=True)
