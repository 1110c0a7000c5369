# corpus: style=lightning class=OK
# the same warm-up of K; the horizon summed per epoch from the callback's own schedule
import math

import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import GradientAccumulationScheduler


class Net(pl.LightningModule):
    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self):
        opt = torch.optim.AdamW(self.parameters(), lr=1e-3)
        per_epoch = self.trainer.estimated_stepping_batches // self.trainer.max_epochs
        cb = next(c for c in self.trainer.callbacks if isinstance(c, GradientAccumulationScheduler))
        steps = sum(math.ceil(per_epoch / cb.get_accumulate_grad_batches(e))
                    for e in range(self.trainer.max_epochs))
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=steps)
        return [opt], [{"scheduler": sched, "interval": "step"}]


trainer = pl.Trainer(max_epochs=6, callbacks=[GradientAccumulationScheduler({0: 8, 3: 2})])
trainer.fit(Net(), loader)
