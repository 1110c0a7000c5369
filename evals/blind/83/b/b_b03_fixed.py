"""Intent classifier trained with DDP + ZeroRedundancyOptimizer (sharded AdamW state).

Gradient accumulation over K micro-batches with DDP.no_sync on all but the
last micro-batch of each window.
"""
import hashlib
import os
from contextlib import nullcontext

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel as DDP

VOCAB, N_CLASSES, SEQ = 200, 6, 16
MICRO_BS, ACCUM, N_UPDATES = 6, 3, 12
SEED = 2024


class BagClassifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.EmbeddingBag(VOCAB, 48, mode="mean")
        self.mlp = nn.Sequential(nn.Linear(48, 96), nn.ReLU(), nn.Linear(96, N_CLASSES))

    def forward(self, tokens):
        return self.mlp(self.emb(tokens))

    def compute_loss(self, batch):
        logits = self(batch["tokens"])
        return F.cross_entropy(logits, batch["label"], label_smoothing=0.05)


def build_batches(rank, world):
    g = torch.Generator().manual_seed(SEED)
    n = N_UPDATES * ACCUM * MICRO_BS * world
    tokens = torch.randint(0, VOCAB, (n, SEQ), generator=g)
    label = (tokens[:, :4].sum(1) + tokens[:, -1]) % N_CLASSES
    tokens, label = tokens[rank::world], label[rank::world]
    out = []
    for i in range(0, tokens.shape[0], MICRO_BS):
        out.append({"tokens": tokens[i : i + MICRO_BS], "label": label[i : i + MICRO_BS]})
    return out


class Trainer:
    def __init__(self, rank, world):
        self.rank, self.world = rank, world
        torch.manual_seed(SEED)
        self.model = DDP(BagClassifier())
        self.opt = ZeroRedundancyOptimizer(
            self.model.parameters(), optimizer_class=torch.optim.AdamW, lr=2e-3, weight_decay=0.01
        )
        self.batches = build_batches(rank, world)

    def micro_step(self, batch, sync):
        ctx = nullcontext() if sync else self.model.no_sync()
        with ctx:
            logits = self.model(batch["tokens"])
            loss = F.cross_entropy(logits, batch["label"], label_smoothing=0.05)
            (loss / ACCUM).backward()
        return loss.detach()

    def fit(self):
        for update in range(N_UPDATES):
            window = self.batches[update * ACCUM : (update + 1) * ACCUM]
            losses = [self.micro_step(b, sync=(j == ACCUM - 1)) for j, b in enumerate(window)]
            self.opt.step()
            self.opt.zero_grad(set_to_none=True)
            if self.rank == 0 and update % 4 == 0:
                print(f"update {update} loss {torch.stack(losses).mean():.4f}", flush=True)

    def final_hash(self):
        h = hashlib.sha256()
        for _, p in self.model.module.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        return h.hexdigest()


def main():
    dist.init_process_group("gloo")
    t = Trainer(dist.get_rank(), dist.get_world_size())
    t.fit()
    digest = t.final_hash()
    if t.rank == 0:
        print(f"FINAL_SHA256 {digest}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
