# corpus: style=lightning class=LOSS_SCALE
"""A training_step that divides by K as a hand-written loop would; Lightning divides by
accumulate_grad_batches again."""
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
        return {"loss": loss / GRAD_ACCUM}  # expect: AG173

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


trainer = pl.Trainer(max_epochs=3, accumulate_grad_batches=GRAD_ACCUM)
trainer.fit(LitClassifier(), train_dataloaders=make_loader())
