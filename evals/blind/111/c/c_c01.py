"""Ragged-sequence LM, Lightning manual optimisation where one DataLoader item is a whole window.

Each training_step receives a window of up to K padded micro-batches (the epoch's last window is
shorter).  The loss is the token-level cross-entropy summed over the window and divided by the
window's valid-token count averaged over the ranks (``strategy.reduce(..., "mean")``): DDP's
average over W ranks then turns it into sum / (W * mean) = sum / (all-ranks count).  The gradient
sync is deferred with ``toggle_model(sync_grad=...)`` until the window's last micro-batch.
The data is sharded by hand (``use_distributed_sampler=False``).
"""
import hashlib
import os
from dataclasses import dataclass

os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("MASTER_PORT", "49211")

import torch
import torch.nn as nn
import torch.nn.functional as F
import pytorch_lightning as pl
from torch.utils.data import DataLoader


@dataclass
class Cfg:
    vocab: int = 40
    d: int = 32
    max_len: int = 20
    seqs_per_micro: int = 4
    K: int = 3
    windows_per_rank: int = 6      # 5 full windows + 1 short window per epoch
    last_window: int = 2
    epochs: int = 2
    lr: float = 2e-3
    seed: int = 5


def build_windows(cfg, rank, world):
    """Deterministic ragged micro-batches; every rank gets the same window structure."""
    g = torch.Generator().manual_seed(cfg.seed)
    sizes = [cfg.K] * (cfg.windows_per_rank - 1) + [cfg.last_window]
    all_windows = []
    for r in range(world):
        wins = []
        for n_micro in sizes:
            win = []
            for _ in range(n_micro):
                lens = torch.randint(4, cfg.max_len + 1, (cfg.seqs_per_micro,), generator=g)
                L = int(lens.max())
                start = torch.randint(0, cfg.vocab, (cfg.seqs_per_micro, 1), generator=g)
                ids = (start + 2 * torch.arange(L)) % cfg.vocab
                mask = torch.arange(L)[None, :] < lens[:, None]
                ids = ids.masked_fill(~mask, 0)
                win.append((ids, mask))
            wins.append(win)
        all_windows.append(wins)
    return all_windows[rank]


class CausalConvLM(pl.LightningModule):
    def __init__(self, cfg: Cfg):
        super().__init__()
        self.cfg = cfg
        self.automatic_optimization = False
        self.tok = nn.Embedding(cfg.vocab, cfg.d)
        self.pos = nn.Embedding(cfg.max_len, cfg.d)
        self.pos.weight.requires_grad_(False)          # fixed random positional table
        self.conv1 = nn.Conv1d(cfg.d, cfg.d, 3, padding=2)
        self.conv2 = nn.Conv1d(cfg.d, cfg.d, 3, padding=2)
        self.norm = nn.LayerNorm(cfg.d)
        self.head = nn.Linear(cfg.d, cfg.vocab)

    def forward(self, ids):
        T = ids.size(1)
        x = self.tok(ids) + self.pos(torch.arange(T))
        h = F.gelu(self.conv1(x.transpose(1, 2))[..., :T])
        h = self.conv2(h)[..., :T].transpose(1, 2)
        return self.head(self.norm(x + h))

    def train_dataloader(self):
        windows = build_windows(self.cfg, self.global_rank, self.trainer.world_size)
        return DataLoader(windows, batch_size=None, shuffle=False)

    def training_step(self, window, batch_idx):
        opt = self.optimizers()
        sched = self.lr_schedulers()
        local = torch.tensor(float(sum(int(m[:, 1:].sum()) for _, m in window)))
        mean_count = self.trainer.strategy.reduce(local, reduce_op="mean")
        total = 0.0
        for j, (ids, mask) in enumerate(window):
            last = j == len(window) - 1
            with opt.toggle_model(sync_grad=last):
                logits = self(ids[:, :-1])
                tok_loss = F.cross_entropy(logits.reshape(-1, self.cfg.vocab), ids[:, 1:].reshape(-1),
                                           reduction="none")
                loss = (tok_loss * mask[:, 1:].reshape(-1).float()).sum() / mean_count
                self.manual_backward(loss)
            total += loss.detach()
        opt.step()
        opt.zero_grad()
        sched.step()
        self.log("loss", total)

    def configure_optimizers(self):
        decay = [p for n, p in self.named_parameters() if p.requires_grad and p.ndim >= 2]
        other = [p for n, p in self.named_parameters() if p.requires_grad and p.ndim < 2]
        opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                                 {"params": other, "weight_decay": 0.0}], lr=self.cfg.lr)
        total_steps = self.cfg.windows_per_rank * self.cfg.epochs
        sched = torch.optim.lr_scheduler.LinearLR(opt, 1.0, 0.2, total_iters=total_steps)
        return [opt], [sched]


def param_digest(module):
    h = hashlib.sha256()
    for _, p in module.named_parameters():
        h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def main():
    cfg = Cfg()
    torch.set_num_threads(1)
    pl.seed_everything(cfg.seed)
    model = CausalConvLM(cfg)
    trainer = pl.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=cfg.epochs,
                         use_distributed_sampler=False, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, deterministic=True)
    trainer.fit(model)
    if trainer.is_global_zero:
        print("FINAL_SHA256", param_digest(model))


if __name__ == "__main__":
    main()
