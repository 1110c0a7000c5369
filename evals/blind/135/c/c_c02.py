"""Lightning manual optimisation: a frozen token table, an encoder trained by AdamW and a
classifier head trained by SGD, accumulated by hand over K = 2 micro-batches on 2 DDP ranks."""
import hashlib
from dataclasses import dataclass, asdict

import torch
import torch.nn as nn
import torch.nn.functional as F
import pytorch_lightning as pl
from torch.utils.data import DataLoader, TensorDataset


@dataclass
class Cfg:
    vocab: int = 50
    dim: int = 24
    seq: int = 12
    classes: int = 4
    micro_bs: int = 4
    accum: int = 2
    epochs: int = 2
    batches_per_rank: int = 8
    enc_lr: float = 2e-3
    head_lr: float = 0.1
    seed: int = 3


class TwoOptClassifier(pl.LightningModule):
    def __init__(self, cfg: Cfg):
        super().__init__()
        self.save_hyperparameters(asdict(cfg))
        self.automatic_optimization = False
        self.cfg = cfg
        self.table = nn.Embedding(cfg.vocab, cfg.dim)
        self.table.weight.requires_grad_(False)   # pretrained, kept frozen
        self.encoder = nn.GRU(cfg.dim, cfg.dim, batch_first=True)
        self.head = nn.Linear(cfg.dim, cfg.classes)

    def forward(self, ids):
        _, h = self.encoder(self.table(ids))
        return self.head(h[-1])

    def training_step(self, batch, batch_idx):
        ids, y = batch
        opt_enc, opt_head = self.optimizers()
        sched = self.lr_schedulers()
        loss = F.cross_entropy(self(ids), y) / self.cfg.accum
        self.manual_backward(loss)
        if (batch_idx + 1) % self.cfg.accum == 0:
            opt_enc.step()
            opt_head.step()
            opt_enc.zero_grad()
            opt_head.zero_grad()
            sched.step()

    def configure_optimizers(self):
        opt_enc = torch.optim.AdamW(self.encoder.parameters(), lr=self.cfg.enc_lr)
        opt_head = torch.optim.SGD(self.head.parameters(), lr=self.cfg.head_lr, momentum=0.8)
        sched = torch.optim.lr_scheduler.StepLR(opt_enc, step_size=3, gamma=0.5)
        return [opt_enc, opt_head], [sched]


def main():
    cfg = Cfg()
    pl.seed_everything(cfg.seed)
    g = torch.Generator().manual_seed(cfg.seed)
    n = 2 * cfg.batches_per_rank * cfg.micro_bs
    ids = torch.randint(0, cfg.vocab, (n, cfg.seq), generator=g)
    y = (ids[:, :3].sum(1) % cfg.classes)
    loader = DataLoader(TensorDataset(ids, y), batch_size=cfg.micro_bs)
    model = TwoOptClassifier(cfg)
    trainer = pl.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=cfg.epochs,
                         deterministic=True, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(model, loader)
    if trainer.global_rank == 0:
        h = hashlib.sha256()
        for _, p in model.named_parameters():
            h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
        print("FINAL_SHA256", h.hexdigest())


if __name__ == "__main__":
    main()
