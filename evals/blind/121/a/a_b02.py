"""Next-token MLP-mixer LM sharded with FSDP2 (fully_shard), bf16 compute.

A small trainer class: gradients of K micro-batches are accumulated locally
(gradient sync deferred) and reduce-scattered once per optimizer step.
"""
import hashlib
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

VOCAB, CTX, DIM = 97, 16, 64
MICRO_BS, ACCUM, STEPS = 4, 4, 8
LR = 2e-3


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(DIM)
        self.tok_mix = nn.Linear(CTX, CTX)
        self.ff = nn.Sequential(nn.Linear(DIM, 4 * DIM), nn.GELU(), nn.Linear(4 * DIM, DIM))

    def forward(self, h):
        mask = torch.tril(torch.ones(CTX, CTX, device=h.device, dtype=h.dtype))
        w = self.tok_mix.weight * mask
        h = h + torch.einsum("ts,bsd->btd", w, self.norm(h))
        return h + self.ff(self.norm(h))


class MixerLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, DIM)
        self.blocks = nn.ModuleList([Block() for _ in range(2)])
        self.head = nn.Linear(DIM, VOCAB)

    def forward(self, idx):
        h = self.emb(idx)
        for b in self.blocks:
            h = b(h)
        return self.head(h)


class FSDPTrainer:
    def __init__(self, rank, world):
        self.rank, self.world = rank, world
        torch.manual_seed(0)
        model = MixerLM()
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16)
        for blk in model.blocks:
            fully_shard(blk, mp_policy=mp)
        fully_shard(model, mp_policy=mp)
        self.model = model
        self.opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)
        g = torch.Generator().manual_seed(100 + rank)
        n = STEPS * ACCUM * MICRO_BS
        self.data = torch.randint(0, VOCAB, (n, CTX + 1), generator=g)
        # make the sequences learnable: next token = (tok * 3 + 1) % VOCAB half of the time
        keep = torch.rand(n, CTX, generator=g) < 0.5
        self.data[:, 1:] = torch.where(keep, (self.data[:, :-1] * 3 + 1) % VOCAB, self.data[:, 1:])

    def micro_batches(self):
        for i in range(0, len(self.data), MICRO_BS):
            chunk = self.data[i:i + MICRO_BS]
            yield chunk[:, :-1], chunk[:, 1:]

    def compute_loss(self, x, y):
        logits = self.model(x)
        return F.cross_entropy(logits.float().reshape(-1, VOCAB), y.reshape(-1))

    def fit(self):
        micro = 0
        for x, y in self.micro_batches():
            last = (micro + 1) % ACCUM == 0
            self.model.set_requires_gradient_sync(last)
            loss = self.compute_loss(x, y) / ACCUM
            loss.backward()
            micro += 1
            if last:
                self.opt.step()
                self.opt.zero_grad(set_to_none=True)
        return micro // ACCUM

    def digest(self):
        h = hashlib.sha256()
        for _, p in self.model.named_parameters():
            full = p.full_tensor() if hasattr(p, "full_tensor") else p
            h.update(full.detach().to(torch.float32).contiguous().numpy().tobytes())
        return h.hexdigest()


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.use_deterministic_algorithms(True)
    trainer = FSDPTrainer(rank, world)
    steps = trainer.fit()
    d = trainer.digest()
    if rank == 0:
        print(f"steps {steps}")
        print(f"FINAL_SHA256 {d}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
