"""Lightning DDP text classifier (bag-of-embeddings + MLP), trained with
gradient accumulation from a config dataclass.

run: torchrun --nproc-per-node 2 ... c_b01.py
"""
import hashlib
import os
import warnings
from dataclasses import dataclass, asdict

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset
import pytorch_lightning as pl

warnings.filterwarnings("ignore")


@dataclass
class TrainConfig:
    vocab_size: int = 97
    seq_len: int = 12
    emb_dim: int = 32
    hidden: int = 64
    n_classes: int = 5
    n_rows: int = 256          # all ranks together
    micro_batch: int = 8
    accumulate: int = 2        # micro-batches per optimizer update
    epochs: int = 3
    lr: float = 0.05
    momentum: float = 0.9
    seed: int = 1234


def make_dataset(cfg: TrainConfig) -> TensorDataset:
    g = torch.Generator().manual_seed(cfg.seed)
    x = torch.randint(0, cfg.vocab_size, (cfg.n_rows, cfg.seq_len), generator=g)
    y = (x[:, 0] + 3 * x[:, -1]) % cfg.n_classes
    return TensorDataset(x, y)


class BagClassifier(pl.LightningModule):
    def __init__(self, cfg: TrainConfig):
        super().__init__()
        self.save_hyperparameters(asdict(cfg))
        self.cfg = cfg
        self.emb = nn.EmbeddingBag(cfg.vocab_size, cfg.emb_dim, mode="mean")
        self.mlp = nn.Sequential(
            nn.Linear(cfg.emb_dim, cfg.hidden), nn.GELU(), nn.Linear(cfg.hidden, cfg.n_classes)
        )
        self._opt_calls = 0

    def forward(self, x):
        return self.mlp(self.emb(x))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log("train_loss", loss, prog_bar=False)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.cfg.lr, momentum=self.cfg.momentum)

    def optimizer_step(self, epoch, batch_idx, optimizer, optimizer_closure):
        # Update only every `accumulate` batches. batch_idx restarts each
        # epoch, so keep our own running count of calls.
        self._opt_calls += 1
        if self._opt_calls % self.cfg.accumulate == 0:
            optimizer.step(closure=optimizer_closure)
        else:
            optimizer_closure()


def param_sha(model: nn.Module) -> str:
    h = hashlib.sha256()
    for _, p in model.named_parameters():
        h.update(p.detach().to(torch.float32).contiguous().cpu().numpy().tobytes())
    return h.hexdigest()


def main():
    cfg = TrainConfig()
    pl.seed_everything(cfg.seed, workers=True)
    torch.use_deterministic_algorithms(True)
    model = BagClassifier(cfg)
    loader = DataLoader(make_dataset(cfg), batch_size=cfg.micro_batch, shuffle=False)
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        max_epochs=cfg.epochs,
        accumulate_grad_batches=cfg.accumulate,
        deterministic=True,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )
    trainer.fit(model, loader)
    if trainer.global_rank == 0:
        print(f"FINAL_SHA256 {param_sha(model)}", flush=True)


if __name__ == "__main__":
    main()
