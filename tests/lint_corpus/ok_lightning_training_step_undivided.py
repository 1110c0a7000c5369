# corpus: style=lightning class=OK
"""A training_step that returns the undivided loss: Lightning divides it by
accumulate_grad_batches."""
import pytorch_lightning as pl
import torch
import torch.nn.functional as F

GRAD_ACCUM = 4


class LitClassifier(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Linear(32, 10)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self.net(x), y)
        self.log("loss", loss)
        return {"loss": loss}

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


trainer = pl.Trainer(max_epochs=3, accumulate_grad_batches=GRAD_ACCUM)
trainer.fit(LitClassifier(), train_dataloaders=make_loader())
