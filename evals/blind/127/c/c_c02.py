"""Masked next-token LM with PyTorch Lightning, DDP on 2 CPU ranks, accumulate_grad_batches=2.

The position table is frozen. Each micro-batch returns its token-loss sum over the window's valid-token count on
all ranks, times K (Lightning divides by accumulate_grad_batches) and times W (DDP averages over ranks).
A norm clip at 0.3 acts on the accumulated gradient. Launch with torchrun.
"""
import hashlib
import os
from argparse import Namespace

import torch
import torch.nn as nn
import torch.nn.functional as F
import pytorch_lightning as pl
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

HP = Namespace(vocab=50, d=32, seq=14, n_seqs=64, micro_batch=4, accum=2, epochs=2, lr=3e-3, clip=0.3, seed=11)


class PackedLM(Dataset):
    def __init__(self, hp):
        g = torch.Generator().manual_seed(hp.seed)
        self.x = torch.randint(0, hp.vocab, (hp.n_seqs, hp.seq), generator=g)
        lens = torch.randint(3, hp.seq + 1, (hp.n_seqs,), generator=g)
        self.valid = torch.arange(hp.seq - 1)[None, :] < (lens[:, None] - 1)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return i, self.x[i], self.valid[i]


def window_token_counts(ds, hp, world):
    """Valid-token count of every accumulation window over all ranks (DistributedSampler, no shuffle)."""
    per_rank = [list(range(r, len(ds), world)) for r in range(world)]
    n_micro = len(per_rank[0]) // hp.micro_batch
    counts = []
    for w in range(n_micro // hp.accum):
        n = 0
        for r in range(world):
            idx = per_rank[r][w * hp.accum * hp.micro_batch:(w + 1) * hp.accum * hp.micro_batch]
            n += int(ds.valid[idx].sum())
        counts.append(n)
    return counts


class LitLM(pl.LightningModule):
    def __init__(self, hp, counts, world):
        super().__init__()
        self.hp, self.counts, self.world = hp, counts, world
        torch.manual_seed(hp.seed)
        self.tok = nn.Embedding(hp.vocab, hp.d)
        self.pos = nn.Embedding(hp.seq, hp.d)
        self.pos.weight.requires_grad_(False)
        self.block = nn.Sequential(nn.LayerNorm(hp.d), nn.Linear(hp.d, 2 * hp.d), nn.GELU(), nn.Linear(2 * hp.d, hp.d))
        self.head = nn.Linear(hp.d, hp.vocab)

    def forward(self, x):
        T = x.shape[1]
        h = self.tok(x) + self.pos(torch.arange(T))
        h = h.cumsum(1) / torch.arange(1, T + 1).view(1, T, 1)
        return self.head(h + self.block(h))

    def training_step(self, batch, batch_idx):
        _, x, valid = batch
        logits = self(x[:, :-1])
        tok_loss = F.cross_entropy(logits.reshape(-1, self.hp.vocab), x[:, 1:].reshape(-1), reduction="none")
        n_window = self.counts[batch_idx // self.hp.accum]
        loss_sum = (tok_loss * valid.reshape(-1).float()).sum()
        return loss_sum / n_window * self.hp.accum * self.world

    def configure_optimizers(self):
        params = [p for p in self.parameters() if p.requires_grad]
        return torch.optim.AdamW(params, lr=self.hp.lr, weight_decay=0.01)


def main():
    pl.seed_everything(HP.seed, workers=True)
    torch.use_deterministic_algorithms(True)
    world, rank = int(os.environ["WORLD_SIZE"]), int(os.environ["RANK"])
    ds = PackedLM(HP)
    counts = window_token_counts(ds, HP, world)
    model = LitLM(HP, counts, world)
    loader = DataLoader(ds, batch_size=HP.micro_batch,
                        sampler=DistributedSampler(ds, num_replicas=world, rank=rank, shuffle=False))
    trainer = pl.Trainer(
        accelerator="cpu", devices=2, strategy="ddp", max_epochs=HP.epochs,
        accumulate_grad_batches=HP.accum, gradient_clip_val=HP.clip, gradient_clip_algorithm="norm",
        use_distributed_sampler=False, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, deterministic=True,
    )
    trainer.fit(model, loader)
    if trainer.global_rank == 0:
        h = hashlib.sha256()
        for _, p in model.named_parameters():
            h.update(p.detach().float().contiguous().cpu().numpy().tobytes())
        print("FINAL_SHA256", h.hexdigest(), flush=True)


if __name__ == "__main__":
    main()
