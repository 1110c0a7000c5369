# FSDP2 (fully_shard) LM-ish trainer with gradient accumulation. Gradient reduction
# is averaged over the whole accumulation window by FSDP's divide factor.
import hashlib, os
from dataclasses import dataclass
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard


@dataclass
class TrainConfig:
    vocab: int = 64
    dim: int = 32
    seq: int = 12
    micro_bs: int = 4
    grad_accum: int = 4
    steps: int = 12
    lr: float = 0.05
    momentum: float = 0.9
    seed: int = 0


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.ln = nn.LayerNorm(d)
        self.ff = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x):
        return x + self.ff(self.ln(x))


class TinyLM(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.emb = nn.Embedding(cfg.vocab, cfg.dim)
        self.blocks = nn.ModuleList([Block(cfg.dim) for _ in range(2)])
        self.out = nn.Linear(cfg.dim, cfg.vocab)

    def forward(self, idx):
        h = self.emb(idx)
        for b in self.blocks:
            h = b(h)
        return self.out(h)


def shard_model(model, world, cfg):
    for b in model.blocks:
        fully_shard(b)
    fully_shard(model)
    # average over every sample of the window: W ranks x K micro-batches
    for m in model.modules():
        if hasattr(m, "set_gradient_divide_factor"):
            m.set_gradient_divide_factor(float(world * cfg.grad_accum))
            m.set_force_sum_reduction_for_comms(True)  # gloo has no PREMUL_SUM
    return model


class Trainer:
    def __init__(self, cfg):
        self.cfg = cfg
        dist.init_process_group("gloo")
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        torch.manual_seed(cfg.seed)
        self.model = shard_model(TinyLM(cfg), self.world, cfg)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=cfg.lr, momentum=cfg.momentum)
        self.gen = torch.Generator().manual_seed(1000 + self.rank)

    def micro_batch(self):
        c = self.cfg
        x = torch.randint(0, c.vocab, (c.micro_bs, c.seq + 1), generator=self.gen)
        x[:, 1:] = (x[:, :-1] * 3 + 1) % c.vocab
        return x[:, :-1], x[:, 1:]

    def compute_loss(self, x, y):
        logits = self.model(x)
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1))

    def train(self):
        K = self.cfg.grad_accum
        for step in range(self.cfg.steps):
            for k in range(K):
                self.model.set_requires_gradient_sync(k == K - 1)
                x, y = self.micro_batch()
                loss = self.compute_loss(x, y) / K
                loss.backward()
            self.opt.step()
            self.opt.zero_grad(set_to_none=True)

    def final_sha(self):
        chunks = []
        for n, p in self.model.named_parameters():
            full = p.full_tensor() if hasattr(p, "full_tensor") else p
            chunks.append(full.detach().float().cpu().numpy().tobytes())
        if self.rank == 0:
            print("FINAL_SHA256", hashlib.sha256(b"".join(chunks)).hexdigest(), flush=True)


if __name__ == "__main__":
    t = Trainer(TrainConfig())
    t.train()
    t.final_sha()
    dist.barrier()
    dist.destroy_process_group()
