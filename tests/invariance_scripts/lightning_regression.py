"""A Lightning script in automatic optimisation (forward and backward run in the closure
Lightning passes to ``optimizer.step``): ``--accum K --micro-batch MB``, a mean loss per
micro-batch (Lightning divides it by accumulate_grad_batches): exact for every K."""

from __future__ import annotations

import argparse

import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader, TensorDataset


class Regression(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(4, 1))

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], index: int) -> torch.Tensor:
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.05)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--accum", type=int, required=True)
    p.add_argument("--micro-batch", type=int, required=True)
    a = p.parse_args()
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
    trainer = pl.Trainer(max_steps=4, accumulate_grad_batches=a.accum, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, accelerator="cpu", devices=1)
    trainer.fit(Regression(), DataLoader(data, batch_size=a.micro_batch, shuffle=False))


if __name__ == "__main__":
    main()
