"""Lightning with ``strategy="ddp"`` on 2 CPU processes: Lightning's subprocess launcher
starts rank 1 from rank 0's process, and its automatic optimisation runs each window's last
micro-step inside ``optimizer.step(closure)``. ``python lightning_ddp.py OUT`` fits twice in
one launch, each recorded in ``OUT/<case>`` as ``watch``'s bootstrap records it: ``ok``
(correct) and ``world`` (the loss divided by ``self.trainer.world_size`` on top of DDP's
average: F10)."""

import sys
from pathlib import Path

import pytorch_lightning as pl
import torch
import torch.nn.functional as F  # noqa: N812
from torch.utils.data import DataLoader, TensorDataset

from accumguard.watch._recording import recording


class Net(pl.LightningModule):
    def __init__(self, bug: bool) -> None:
        super().__init__()
        self.bug = bug
        self.layers = torch.nn.Sequential(torch.nn.Linear(10, 16), torch.nn.ReLU(),
                                          torch.nn.Linear(16, 3))

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], idx: int) -> torch.Tensor:
        x, y = batch
        loss = F.cross_entropy(self.layers(x), y)
        return loss / self.trainer.world_size if self.bug else loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.3)


if __name__ == "__main__":
    out = Path(sys.argv[1])
    g = torch.Generator().manual_seed(0)
    ds = TensorDataset(torch.randn(48, 10, generator=g), torch.randint(0, 3, (48,), generator=g))
    for case in ("ok", "world"):
        pl.seed_everything(0, verbose=False)
        model = Net(case == "world")
        trainer = pl.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=1,
                             accumulate_grad_batches=3, logger=False, enable_checkpointing=False,
                             enable_progress_bar=False, enable_model_summary=False)
        with recording(out / case):
            trainer.fit(model, DataLoader(ds, batch_size=4))
