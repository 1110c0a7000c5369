# corpus: style=lightning class=F4
# K warms up from 8 to 2 by a callback; the cosine horizon is Lightning's estimate, read in
# configure_optimizers before the callback has set K: it counts every batch as a step
import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import GradientAccumulationScheduler


class Net(pl.LightningModule):
    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self):
        opt = torch.optim.AdamW(self.parameters(), lr=1e-3)
        steps = self.trainer.estimated_stepping_batches  # expect: AG302
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=steps)
        return [opt], [{"scheduler": sched, "interval": "step"}]


trainer = pl.Trainer(max_epochs=6, callbacks=[GradientAccumulationScheduler({0: 8, 3: 2})])
trainer.fit(Net(), loader)
