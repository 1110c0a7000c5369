# corpus: style=lightning class=OK
import pytorch_lightning as pl
import torch


class LitModel(pl.LightningModule):
    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.cross_entropy(self(x), y)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-3)


trainer = pl.Trainer(accumulate_grad_batches=4, max_epochs=3)
trainer.fit(LitModel(), dm)
