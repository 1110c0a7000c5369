# corpus: style=lightning class=OK
# a LightningModule stepping its scheduler in on_train_batch_end without accumulation
# (accumulate_grad_batches=1): one batch is one optimizer step
import lightning.pytorch as pl
import torch


class Net(pl.LightningModule):
    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.cross_entropy(self.model(x), y)

    def on_train_batch_end(self, outputs, batch, batch_idx):
        self.lr_schedulers().step()

    def configure_optimizers(self):
        opt = torch.optim.AdamW(self.parameters(), lr=1e-3)
        return {"optimizer": opt, "lr_scheduler": torch.optim.lr_scheduler.LinearLR(opt, 0.1, 1.0, 100)}


trainer = pl.Trainer(max_epochs=3, accumulate_grad_batches=1)
trainer.fit(Net(), train_loader)
