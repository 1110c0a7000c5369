# corpus: style=lightning class=F4
# a Lightning callback steps the scheduler in on_train_batch_end, which runs on every batch:
# with accumulate_grad_batches=4 the schedule advances 4 times per optimizer step
import lightning.pytorch as pl
import torch


class ManualSchedule(pl.Callback):
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        trainer.lr_scheduler_configs[0].scheduler.step()  # expect: AG119


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
