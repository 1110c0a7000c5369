"""Tabular classifier with Lightning (automatic optimisation), DDP on 2 CPU ranks.

Gradient accumulation is left to the Trainer (accumulate_grad_batches); a linear LR
warm-up is applied by hand in the optimizer_step hook, as in the Lightning docs.
"""
import hashlib
import os
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

import pytorch_lightning as pl


@dataclass
class HParams:
    in_dim: int = 24
    hidden: int = 64
    n_classes: int = 5
    lr: float = 3e-3
    weight_decay: float = 0.01
    warmup_steps: int = 10
    accumulate: int = 3
    batch_size: int = 4
    samples: int = 144          # 2 ranks x 18 batches x 4
    epochs: int = 4


def make_data(hp: HParams):
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(hp.samples, hp.in_dim, generator=g)
    w = torch.randn(hp.in_dim, hp.n_classes, generator=g)
    y = (x @ w + 0.5 * torch.randn(hp.samples, hp.n_classes, generator=g)).argmax(-1)
    return TensorDataset(x, y)


class TabularClassifier(pl.LightningModule):
    def __init__(self, hp: HParams):
        super().__init__()
        self.hp = hp
        self.net = nn.Sequential(
            nn.Linear(hp.in_dim, hp.hidden), nn.GELU(),
            nn.Linear(hp.hidden, hp.hidden), nn.GELU(),
            nn.Linear(hp.hidden, hp.n_classes),
        )

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        return loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=self.hp.lr,
                                 weight_decay=self.hp.weight_decay)

    def optimizer_step(self, epoch, batch_idx, optimizer, optimizer_closure):
        # linear warm-up of the learning rate
        scale = min(1.0, float(batch_idx + 1) / self.hp.warmup_steps)
        for pg in optimizer.param_groups:
            pg["lr"] = scale * self.hp.lr
        optimizer.step(closure=optimizer_closure)


def params_sha256(module: nn.Module) -> str:
    h = hashlib.sha256()
    for _, p in module.named_parameters():
        h.update(p.detach().to(torch.float32).contiguous().cpu().numpy().tobytes())
    return h.hexdigest()


def main():
    hp = HParams()
    pl.seed_everything(0, workers=True)
    torch.use_deterministic_algorithms(True)
    model = TabularClassifier(hp)
    loader = DataLoader(make_data(hp), batch_size=hp.batch_size, shuffle=False)
    trainer = pl.Trainer(
        accelerator="cpu", devices=2, strategy="ddp", num_nodes=1,
        max_epochs=hp.epochs, accumulate_grad_batches=hp.accumulate,
        logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, deterministic=True,
    )
    trainer.fit(model, loader)
    if trainer.global_rank == 0:
        print(f"FINAL_SHA256 {params_sha256(model)}", flush=True)
        torch.save({k: v.detach().clone() for k, v in model.state_dict().items()},
                   os.path.join(os.path.dirname(os.path.abspath(__file__)), "tmp_scratch",
                                os.path.basename(__file__).replace(".py", ".pt")))


if __name__ == "__main__":
    main()
