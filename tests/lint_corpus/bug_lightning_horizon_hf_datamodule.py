# corpus: style=lightning class=F4
import pytorch_lightning as pl
import torch
from transformers import AutoModelForSequenceClassification, get_linear_schedule_with_warmup

NUM_EPOCHS = 3
GRAD_ACCUM = 16


class FineTuner(pl.LightningModule):
    def __init__(self, name="bert-base-uncased"):
        super().__init__()
        self.model = AutoModelForSequenceClassification.from_pretrained(name, num_labels=2)

    def training_step(self, batch, batch_idx):
        out = self.model(**batch)
        self.log("loss", out.loss, prog_bar=True)
        return out.loss

    def configure_optimizers(self):
        optimizer = torch.optim.AdamW(self.model.parameters(), lr=2e-5)
        steps_per_epoch = len(self.trainer.datamodule.train_dataloader())
        num_training_steps = steps_per_epoch * NUM_EPOCHS
        scheduler = get_linear_schedule_with_warmup(  # expect: AG124
            optimizer, num_warmup_steps=500, num_training_steps=num_training_steps
        )
        return {
            "optimizer": optimizer,
            "lr_scheduler": {"scheduler": scheduler, "interval": "step", "frequency": 1},
        }


trainer = pl.Trainer(max_epochs=NUM_EPOCHS, accumulate_grad_batches=GRAD_ACCUM, devices=1)
