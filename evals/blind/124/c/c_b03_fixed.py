"""Lightning DDP: a tiny token-tagging model, settings kept in one dataclass.

The dataclass is the single source of truth; whatever the Trainer understands is
forwarded to it automatically so the run script never has to list Trainer options.
"""
import hashlib
import inspect
from dataclasses import asdict, dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
import pytorch_lightning as pl
from torch.utils.data import DataLoader, TensorDataset


@dataclass
class RunConfig:
    # model / data
    vocab: int = 50
    n_tags: int = 7
    d_model: int = 32
    seq_len: int = 12
    n_samples: int = 96          # 48 per rank
    batch_size: int = 4          # per device micro-batch
    # optimisation
    lr: float = 0.05
    momentum: float = 0.9
    grad_accum_steps: int = 3    # 12 micro-batches per rank per epoch -> 4 steps per epoch
    # trainer
    max_epochs: int = 3
    gradient_clip_val: float = 5.0
    deterministic: bool = True
    seed: int = 7


class Tagger(pl.LightningModule):
    def __init__(self, cfg: RunConfig):
        super().__init__()
        self.cfg = cfg
        self.emb = nn.Embedding(cfg.vocab, cfg.d_model)
        self.conv = nn.Conv1d(cfg.d_model, cfg.d_model, kernel_size=3, padding=1)
        self.out = nn.Linear(cfg.d_model, cfg.n_tags)

    def forward(self, x):
        h = self.emb(x).transpose(1, 2)
        h = torch.relu(self.conv(h)).transpose(1, 2)
        return self.out(h)

    def training_step(self, batch, batch_idx):
        x, y = batch
        logits = self(x)
        return F.cross_entropy(logits.reshape(-1, self.cfg.n_tags), y.reshape(-1))

    def configure_optimizers(self):
        opt = torch.optim.SGD(self.parameters(), lr=self.cfg.lr, momentum=self.cfg.momentum)
        total = self.trainer.estimated_stepping_batches
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: max(0.0, 1.0 - s / total))
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def make_dataset(cfg):
    g = torch.Generator().manual_seed(cfg.seed)
    x = torch.randint(0, cfg.vocab, (cfg.n_samples, cfg.seq_len), generator=g)
    y = (x * 3 + torch.roll(x, 1, dims=1)) % cfg.n_tags
    return TensorDataset(x, y)


def trainer_kwargs(cfg):
    accepted = inspect.signature(pl.Trainer.__init__).parameters
    kwargs = {k: v for k, v in asdict(cfg).items() if k in accepted}
    kwargs["accumulate_grad_batches"] = cfg.grad_accum_steps
    return kwargs


def main():
    cfg = RunConfig()
    pl.seed_everything(cfg.seed, workers=True)
    model = Tagger(cfg)
    loader = DataLoader(make_dataset(cfg), batch_size=cfg.batch_size, shuffle=False)
    kwargs = trainer_kwargs(cfg)
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        **kwargs,
    )
    trainer.fit(model, loader)
    h = hashlib.sha256()
    for _, p in model.named_parameters():
        h.update(p.detach().float().contiguous().numpy().tobytes())
    if trainer.global_rank == 0:
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)


if __name__ == "__main__":
    main()
