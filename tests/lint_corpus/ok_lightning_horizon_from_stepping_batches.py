# corpus: style=lightning class=OK
# the same decay sized from Lightning's per-rank estimate
import pytorch_lightning as pl
import torch


class Net(pl.LightningModule):
    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self):
        opt = torch.optim.SGD(self.parameters(), lr=0.1)
        steps = self.trainer.estimated_stepping_batches
        sched = torch.optim.lr_scheduler.LinearLR(opt, 1.0, 0.0, total_iters=steps)
        return [opt], [{"scheduler": sched, "interval": "step"}]


trainer = pl.Trainer(devices=4, strategy="ddp", max_epochs=3, accumulate_grad_batches=2)
trainer.fit(Net(), datamodule=dm)
