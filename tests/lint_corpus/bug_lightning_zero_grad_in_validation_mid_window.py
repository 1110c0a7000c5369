# corpus: style=lightning class=F3
import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback

CFG = {"accum": 4, "val_every": 6}


class FreeGradsForEval(Callback):
    def on_validation_start(self, trainer, pl_module):
        pl_module.zero_grad(set_to_none=True)  # expect: AG192


class Lit(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Linear(8, 2)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.cross_entropy(self.net(x), y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val", torch.nn.functional.cross_entropy(self.net(x), y))

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


def main(train, val):
    trainer = pl.Trainer(max_epochs=1, accumulate_grad_batches=CFG["accum"],
                         val_check_interval=CFG["val_every"], callbacks=[FreeGradsForEval()])
    trainer.fit(Lit(), train, val)
