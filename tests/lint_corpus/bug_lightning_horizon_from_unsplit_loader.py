# corpus: style=lightning class=F4
# a linear decay sized from a freshly built train_dataloader(), on 4 devices
import pytorch_lightning as pl
import torch


class Net(pl.LightningModule):
    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self):
        opt = torch.optim.SGD(self.parameters(), lr=0.1)
        steps = len(self.trainer.datamodule.train_dataloader()) * self.trainer.max_epochs // 2  # expect: AG309
        sched = torch.optim.lr_scheduler.LinearLR(opt, 1.0, 0.0, total_iters=steps)
        return [opt], [{"scheduler": sched, "interval": "step"}]


trainer = pl.Trainer(devices=4, strategy="ddp", max_epochs=3, accumulate_grad_batches=2)
trainer.fit(Net(), datamodule=dm)
