# corpus: style=lightning class=OK
# the horizon divides the batches one rank sees per epoch by the world size and by
# accumulate_grad_batches: optimizer steps, as Lightning steps a "step" scheduler
import math

import lightning.pytorch as pl
import torch
from transformers import get_cosine_schedule_with_warmup


class Classifier(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Linear(16, 4)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.cross_entropy(self.net(x), y)

    def configure_optimizers(self):
        opt = torch.optim.AdamW(self.parameters(), lr=1e-3)
        per_rank = len(self.trainer.datamodule.train_dataloader()) // self.trainer.world_size
        steps = math.ceil(per_rank / self.trainer.accumulate_grad_batches) * self.trainer.max_epochs
        sched = get_cosine_schedule_with_warmup(opt, steps // 10, steps)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def main(dm):
    trainer = pl.Trainer(max_epochs=3, accumulate_grad_batches=4, devices=2, strategy="ddp")
    trainer.fit(Classifier(), datamodule=dm)
