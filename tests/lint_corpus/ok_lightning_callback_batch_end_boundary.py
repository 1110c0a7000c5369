# corpus: style=lightning class=OK
# the same callback, but it steps only on the batch that completes a window
import lightning.pytorch as pl
import torch


class ManualSchedule(pl.Callback):
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if (batch_idx + 1) % trainer.accumulate_grad_batches == 0:
            trainer.lr_scheduler_configs[0].scheduler.step()


class Net(pl.LightningModule):
    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.cross_entropy(self.model(x), y)

    def configure_optimizers(self):
        opt = torch.optim.AdamW(self.parameters(), lr=1e-3)
        sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=1e-3, total_steps=1000)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "epoch"}}


trainer = pl.Trainer(max_epochs=3, accumulate_grad_batches=4, callbacks=[ManualSchedule()])
trainer.fit(Net(), train_loader)
