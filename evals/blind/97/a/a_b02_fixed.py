"""Accelerate: a text encoder and a classification head trained as two prepared models
with two optimizers, gradient accumulation 4 through the Accelerator, a clip on updates.
The loop is split over a small runner class."""
import hashlib
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from accelerate import Accelerator
from accelerate.utils import GradientAccumulationPlugin, set_seed
from torch.utils.data import DataLoader, TensorDataset


@dataclass
class RunConfig:
    grad_accum: int = 4
    micro_batch: int = 4
    enc_lr: float = 2e-3
    head_lr: float = 1e-2
    max_grad_norm: float = 0.12
    epochs: int = 2
    n_samples: int = 256
    vocab: int = 96
    seq: int = 12
    n_classes: int = 5


class Encoder(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.emb = nn.Embedding(cfg.vocab, 32)
        self.mix = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 32))

    def forward(self, ids):
        return self.mix(self.emb(ids)).mean(dim=1)


def make_data(cfg):
    g = torch.Generator().manual_seed(1234)
    ids = torch.randint(0, cfg.vocab, (cfg.n_samples, cfg.seq), generator=g)
    y = (ids[:, :3].sum(dim=1) % cfg.n_classes)
    return TensorDataset(ids, y)


class Runner:
    def __init__(self, cfg: RunConfig):
        self.cfg = cfg
        plugin = GradientAccumulationPlugin(num_steps=cfg.grad_accum)
        self.acc = Accelerator(cpu=True, gradient_accumulation_plugin=plugin)
        set_seed(0)
        enc, head = Encoder(cfg), nn.Linear(32, cfg.n_classes)
        enc_opt = torch.optim.AdamW(enc.parameters(), lr=cfg.enc_lr, weight_decay=0.01)
        head_opt = torch.optim.SGD(head.parameters(), lr=cfg.head_lr, momentum=0.9)
        loader = DataLoader(make_data(cfg), batch_size=cfg.micro_batch, shuffle=True,
                            generator=torch.Generator().manual_seed(7))
        (self.enc, self.head, self.enc_opt, self.head_opt,
         self.loader) = self.acc.prepare(enc, head, enc_opt, head_opt, loader)
        self.is_update = False

    def on_batch_start(self):
        # remember whether this micro-batch closes the accumulation window
        self.is_update = self.acc.sync_gradients

    def micro_step(self, batch):
        ids, y = batch
        with self.acc.accumulate(self.enc, self.head):
            self.is_update = self.acc.sync_gradients
            loss = F.cross_entropy(self.head(self.enc(ids)), y)
            self.acc.backward(loss)
            if self.is_update:
                self.acc.clip_grad_norm_(list(self.enc.parameters()) + list(self.head.parameters()),
                                         self.cfg.max_grad_norm)
            self.enc_opt.step()
            self.head_opt.step()
            self.enc_opt.zero_grad()
            self.head_opt.zero_grad()
        return loss.detach()

    def fit(self):
        for _ in range(self.cfg.epochs):
            for batch in self.loader:
                self.on_batch_start()
                self.micro_step(batch)

    def final_hash(self):
        h = hashlib.sha256()
        for mod in (self.acc.unwrap_model(self.enc), self.acc.unwrap_model(self.head)):
            for _, p in mod.named_parameters():
                h.update(p.detach().float().cpu().numpy().astype(np.float32).tobytes())
        return h.hexdigest()


def main():
    r = Runner(RunConfig())
    r.fit()
    r.acc.wait_for_everyone()
    if r.acc.is_main_process:
        print("FINAL_SHA256", r.final_hash(), flush=True)
    r.acc.end_training()


if __name__ == "__main__":
    main()
