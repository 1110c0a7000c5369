# corpus: style=lightning class=OK
"""A Lightning cosine horizon from estimated_stepping_batches as it is (optimizer steps,
accumulation counted), with a warm-up of a tenth of it."""
import pytorch_lightning as pl
import torch


class LM(pl.LightningModule):
    def configure_optimizers(self):
        opt = torch.optim.SGD(self.parameters(), lr=0.1)
        total = self.trainer.estimated_stepping_batches
        warm = total // 10
        sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.1, total_steps=total,
                                                    pct_start=warm / total)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


trainer = pl.Trainer(accumulate_grad_batches=3, max_epochs=2)
trainer.fit(LM(), loader)
