"""Tiny causal LM on synthetic "copy-with-offset" sequences, Lightning manual optimisation.

Manual optimisation so the optimizer can be swapped for a closure-based one (LBFGS / SAM style)
from the config without touching the training step: every micro-batch goes through the same
closure, which is handed to ``opt.step`` on the window's last micro-batch.
"""
import hashlib
import os
from dataclasses import dataclass
from functools import partial

os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("MASTER_PORT", "49201")

import torch
import torch.nn as nn
import torch.nn.functional as F
import pytorch_lightning as pl
from torch.utils.data import DataLoader, TensorDataset


@dataclass
class LMConfig:
    vocab: int = 48
    d_model: int = 32
    n_layer: int = 2
    seq_len: int = 24
    micro_batch: int = 4
    grad_accum: int = 4
    lr: float = 2e-3
    weight_decay: float = 0.05
    max_epochs: int = 2
    n_seqs: int = 256
    seed: int = 1234


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.ln = nn.LayerNorm(d)
        self.conv = nn.Conv1d(d, d, kernel_size=3, padding=2, groups=1)
        self.mlp = nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))

    def forward(self, x):
        h = self.ln(x).transpose(1, 2)
        h = self.conv(h)[..., : x.size(1)].transpose(1, 2)  # causal conv
        x = x + h
        return x + self.mlp(x)


class TinyLM(pl.LightningModule):
    def __init__(self, cfg: LMConfig):
        super().__init__()
        self.cfg = cfg
        self.automatic_optimization = False
        self.emb = nn.Embedding(cfg.vocab, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg.d_model) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab, bias=False)

    def forward(self, ids):
        x = self.emb(ids)
        for b in self.blocks:
            x = b(x)
        return self.head(self.ln_f(x))

    def lm_loss(self, batch):
        (ids,) = batch
        logits = self(ids[:, :-1])
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)), ids[:, 1:].reshape(-1))

    # one micro-batch: forward + backward, returns the (scaled) loss
    def _closure(self, opt, batch):
        opt.zero_grad()
        loss = self.lm_loss(batch) / self.cfg.grad_accum
        self.manual_backward(loss)
        return loss

    def training_step(self, batch, batch_idx):
        opt = self.optimizers()
        sched = self.lr_schedulers()
        closure = partial(self._closure, opt, batch)
        if (batch_idx + 1) % self.cfg.grad_accum == 0:
            loss = opt.step(closure=closure)
            sched.step()
        else:
            loss = closure()
        self.log("train_loss", loss.detach(), prog_bar=False)

    def configure_optimizers(self):
        decay, no_decay = [], []
        for n, p in self.named_parameters():
            (no_decay if p.ndim < 2 else decay).append(p)
        opt = torch.optim.AdamW(
            [{"params": decay, "weight_decay": self.cfg.weight_decay},
             {"params": no_decay, "weight_decay": 0.0}], lr=self.cfg.lr)
        total = self.trainer.estimated_stepping_batches // self.cfg.grad_accum
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=max(total, 1), eta_min=self.cfg.lr * 0.1)
        return [opt], [sched]


def make_data(cfg):
    g = torch.Generator().manual_seed(cfg.seed)
    start = torch.randint(0, cfg.vocab, (cfg.n_seqs, 1), generator=g)
    step = torch.randint(1, 4, (cfg.n_seqs, 1), generator=g)
    ids = (start + step * torch.arange(cfg.seq_len)) % cfg.vocab
    noise = torch.rand(ids.shape, generator=g) < 0.1
    ids = torch.where(noise, torch.randint(0, cfg.vocab, ids.shape, generator=g), ids)
    return TensorDataset(ids)


def param_digest(module):
    h = hashlib.sha256()
    for _, p in module.named_parameters():
        h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def main():
    cfg = LMConfig()
    pl.seed_everything(cfg.seed, workers=True)
    torch.set_num_threads(1)
    model = TinyLM(cfg)
    loader = DataLoader(make_data(cfg), batch_size=cfg.micro_batch, shuffle=False)
    trainer = pl.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=cfg.max_epochs,
                         logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, deterministic=True)
    trainer.fit(model, loader)
    if trainer.is_global_zero:
        print("FINAL_SHA256", param_digest(model))


if __name__ == "__main__":
    main()
