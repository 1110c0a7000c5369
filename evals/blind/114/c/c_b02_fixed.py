"""Token tagging with a small BiGRU, Lightning DDP on 2 CPU processes.

The loss helpers were shared with our plain-PyTorch trainer; the LightningModule
reuses them with the same TrainConfig.
"""
import hashlib
from dataclasses import dataclass

import pytorch_lightning as pl
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset


@dataclass
class TrainConfig:
    vocab: int = 120
    n_tags: int = 9
    emb: int = 32
    hidden: int = 48
    seq_len: int = 20
    batch_size: int = 8
    accumulate_grad_batches: int = 4
    epochs: int = 3
    lr: float = 0.05
    momentum: float = 0.9
    label_smoothing: float = 0.05
    seed: int = 7


def tagging_loss(logits, tags, cfg: TrainConfig):
    """Per-token CE, averaged over the micro-batch and normalised for accumulation."""
    ce = F.cross_entropy(logits.reshape(-1, cfg.n_tags), tags.reshape(-1),
                         label_smoothing=cfg.label_smoothing)
    return ce  # Lightning divides by accumulate_grad_batches itself


class Tagger(pl.LightningModule):
    def __init__(self, cfg: TrainConfig):
        super().__init__()
        self.cfg = cfg
        self.emb = nn.Embedding(cfg.vocab, cfg.emb)
        self.rnn = nn.GRU(cfg.emb, cfg.hidden, batch_first=True, bidirectional=True)
        self.proj = nn.Sequential(nn.Linear(2 * cfg.hidden, cfg.hidden), nn.Tanh(),
                                  nn.Linear(cfg.hidden, cfg.n_tags))

    def forward(self, tokens):
        h, _ = self.rnn(self.emb(tokens))
        return self.proj(h)

    def training_step(self, batch, batch_idx):
        tokens, tags = batch
        loss = tagging_loss(self(tokens), tags, self.cfg)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.cfg.lr, momentum=self.cfg.momentum)


def make_data(cfg: TrainConfig, n):
    g = torch.Generator().manual_seed(cfg.seed)
    tokens = torch.randint(0, cfg.vocab, (n, cfg.seq_len), generator=g)
    tags = (tokens * 7 + torch.roll(tokens, 1, dims=1)) % cfg.n_tags
    return TensorDataset(tokens, tags)


def main():
    cfg = TrainConfig()
    pl.seed_everything(cfg.seed, workers=True)
    ds = make_data(cfg, 2 * 16 * cfg.batch_size)
    loader = DataLoader(ds, batch_size=cfg.batch_size, shuffle=False)
    model = Tagger(cfg)
    trainer = pl.Trainer(
        accelerator="cpu", devices=2, num_nodes=1, strategy="ddp",
        max_epochs=cfg.epochs,
        accumulate_grad_batches=cfg.accumulate_grad_batches,
        deterministic=True, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False,
    )
    trainer.fit(model, loader)
    flat = torch.cat([p.detach().float().reshape(-1) for _, p in model.named_parameters()])
    if trainer.global_rank == 0:
        print(f"optimizer steps {trainer.global_step}")
        print("FINAL_SHA256", hashlib.sha256(flat.numpy().tobytes()).hexdigest())


if __name__ == "__main__":
    main()
