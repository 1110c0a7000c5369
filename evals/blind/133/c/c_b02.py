"""Tiny causal LM trained with the Lightning Trainer on 2 CPU ranks (DDP).

Large effective batch through `accumulate_grad_batches`; the half-precision setting
comes from the run config.
"""
import hashlib
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
import pytorch_lightning as pl
from torch.utils.data import DataLoader, Dataset


@dataclass
class RunConfig:
    vocab_size: int = 64
    block_size: int = 16
    n_embd: int = 32
    n_head: int = 2
    n_layer: int = 2
    micro_batch: int = 4
    accumulate_grad_batches: int = 8
    samples_per_rank: int = 96
    max_epochs: int = 3
    lr: float = 3e-3
    weight_decay: float = 0.05
    # half precision end to end to cut activation + optimizer memory on the big runs
    precision: str = "bf16-true"
    seed: int = 1337


class Block(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.n_embd)
        self.attn = nn.MultiheadAttention(cfg.n_embd, cfg.n_head, batch_first=True)
        self.ln2 = nn.LayerNorm(cfg.n_embd)
        self.mlp = nn.Sequential(nn.Linear(cfg.n_embd, 4 * cfg.n_embd), nn.GELU(), nn.Linear(4 * cfg.n_embd, cfg.n_embd))

    def forward(self, x, mask):
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class TinyLM(pl.LightningModule):
    def __init__(self, cfg: RunConfig):
        super().__init__()
        self.cfg = cfg
        self.tok = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.pos = nn.Embedding(cfg.block_size, cfg.n_embd)
        self.blocks = nn.ModuleList([Block(cfg) for _ in range(cfg.n_layer)])
        self.ln_f = nn.LayerNorm(cfg.n_embd)
        self.head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)

    def forward(self, idx):
        T = idx.shape[1]
        x = self.tok(idx) + self.pos(torch.arange(T, device=idx.device))
        mask = torch.triu(torch.ones(T, T, dtype=torch.bool, device=idx.device), 1)
        for b in self.blocks:
            x = b(x, mask)
        return self.head(self.ln_f(x))

    def training_step(self, batch, batch_idx):
        x, y = batch
        logits = self(x)
        loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), y.view(-1))
        self.log("train_loss", loss, prog_bar=False)
        return loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=self.cfg.lr, weight_decay=self.cfg.weight_decay)


class RandomTokens(Dataset):
    def __init__(self, cfg, n, seed):
        g = torch.Generator().manual_seed(seed)
        # a cheap learnable structure: each token tends to be followed by (3 * token + 1) mod V
        first = torch.randint(0, cfg.vocab_size, (n, 1), generator=g)
        seq = [first]
        for _ in range(cfg.block_size):
            nxt = (3 * seq[-1] + 1) % cfg.vocab_size
            noise = torch.randint(0, cfg.vocab_size, nxt.shape, generator=g)
            keep = torch.rand(nxt.shape, generator=g) < 0.8
            seq.append(torch.where(keep, nxt, noise))
        self.data = torch.cat(seq, 1)

    def __len__(self):
        return len(self.data)

    def __getitem__(self, i):
        return self.data[i, :-1], self.data[i, 1:]


def main():
    cfg = RunConfig()
    pl.seed_everything(cfg.seed)
    model = TinyLM(cfg)
    ds = RandomTokens(cfg, 2 * cfg.samples_per_rank, seed=7)
    loader = DataLoader(ds, batch_size=cfg.micro_batch, shuffle=False)
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        precision=cfg.precision,
        accumulate_grad_batches=cfg.accumulate_grad_batches,
        max_epochs=cfg.max_epochs,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        deterministic=True,
    )
    trainer.fit(model, loader)
    if trainer.global_rank == 0:
        print("optimizer steps:", trainer.global_step)
        flat = torch.cat([p.detach().float().reshape(-1) for _, p in model.named_parameters()])
        print("FINAL_SHA256", hashlib.sha256(flat.numpy().tobytes()).hexdigest())


if __name__ == "__main__":
    main()
