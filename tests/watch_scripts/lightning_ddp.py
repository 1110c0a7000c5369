"""Lightning with ``strategy="ddp"`` on 2 CPU processes: Lightning's subprocess launcher
starts rank 1 from rank 0's process, and its automatic optimisation runs each window's last
micro-step inside ``optimizer.step(closure)``. ``python lightning_ddp.py OUT`` fits twice in
one launch, each recorded in ``OUT/<case>`` as ``watch``'s bootstrap records it: ``ok``
(correct) and ``world`` (the loss divided by ``self.trainer.world_size`` on top of DDP's
average: F10); then manual optimisation, K = 3: ``manual_sync`` (every micro-step
all-reduces: EXTRA_SYNC) and ``manual_flag`` (the fix watch gives for it: DDP's flag set in
``on_train_batch_start``, before the forward Lightning runs around ``training_step``)."""

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


class Manual(Net):
    """Manual optimisation over windows of K batches; ``flag``: DDP's sync flag is off
    before the forward of every batch but a window's last."""

    K = 3

    def __init__(self, flag: bool) -> None:
        super().__init__(False)
        self.automatic_optimization = False
        self.flag = flag

    def on_train_batch_start(self, batch: object, idx: int) -> None:
        if self.flag:
            self.trainer.strategy.model.require_backward_grad_sync = (idx + 1) % self.K == 0

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], idx: int) -> torch.Tensor:
        x, y = batch
        loss = F.cross_entropy(self.layers(x), y)
        self.manual_backward(loss / self.K)
        if (idx + 1) % self.K == 0:
            opt = self.optimizers()
            opt.step()
            opt.zero_grad()
        return loss


if __name__ == "__main__":
    out = Path(sys.argv[1])
    g = torch.Generator().manual_seed(0)
    ds = TensorDataset(torch.randn(48, 10, generator=g), torch.randint(0, 3, (48,), generator=g))
    for case in ("ok", "world", "manual_sync", "manual_flag"):
        pl.seed_everything(0, verbose=False)
        manual = case.startswith("manual")
        model = Manual(case == "manual_flag") if manual else Net(case == "world")
        # the Trainer is built under the recording, as under `accumguard watch` (which is
        # installed before the script): the fixes then name Lightning's idiom
        with recording(out / case):
            trainer = pl.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=1,
                                 accumulate_grad_batches=1 if manual else 3, logger=False,
                                 enable_checkpointing=False, enable_progress_bar=False,
                                 enable_model_summary=False)
            trainer.fit(model, DataLoader(ds, batch_size=4))
