# corpus: style=lightning class=OK
# the same schedule, frozen once training starts (DDP already holds every parameter)
import pytorch_lightning as pl
import torch


class ProbeThenTune(pl.LightningModule):
    def on_train_start(self):
        self.backbone.requires_grad_(False)

    def on_train_epoch_start(self):
        if self.current_epoch == 2:
            self.backbone.requires_grad_(True)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.cross_entropy(self.head(self.backbone(x)), y)


trainer = pl.Trainer(devices=2, strategy="ddp_find_unused_parameters_true",
                     accumulate_grad_batches=4, max_epochs=5)
trainer.fit(ProbeThenTune(), loader)
