# corpus: style=lightning class=F10
# linear probing then fine-tuning: the backbone frozen in setup (before DDP wraps the module)
import pytorch_lightning as pl
import torch


class ProbeThenTune(pl.LightningModule):
    def setup(self, stage):
        self.backbone.requires_grad_(False)

    def on_train_epoch_start(self):
        if self.current_epoch == 2:
            self.backbone.requires_grad_(True)  # expect: AG301

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.cross_entropy(self.head(self.backbone(x)), y)


trainer = pl.Trainer(devices=2, strategy="ddp", accumulate_grad_batches=4, max_epochs=5)
trainer.fit(ProbeThenTune(), loader)
