# corpus: style=lightning class=OK
"""A LightningModule warming its learning rate up by hand in optimizer_step."""
import lightning.pytorch as pl
import torch
import torch.nn.functional as F

WARMUP = 50
BASE_LR = 3e-4


class Regressor(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(10, 32), torch.nn.GELU(), torch.nn.Linear(32, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.mse_loss(self.net(x).squeeze(-1), y)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=BASE_LR)

    def optimizer_step(self, epoch, batch_idx, optimizer, optimizer_closure=None):
        frac = min(1.0, float(self.trainer.global_step + 1) / WARMUP)
        for pg in optimizer.param_groups:
            pg["lr"] = BASE_LR * frac
        optimizer.step(closure=optimizer_closure)


def main(loader):
    trainer = pl.Trainer(max_epochs=3, accumulate_grad_batches=8, accelerator="cpu", devices=2)
    trainer.fit(Regressor(), loader)
