# corpus: style=lightning class=F4
"""A Lightning cosine horizon from estimated_stepping_batches divided by K, as if it counted
batches: it already counts optimizer steps, so the schedule ends after 1/K of the fit
(blind round 121 c_b03)."""
import math

import pytorch_lightning as pl
import torch


class LM(pl.LightningModule):
    def configure_optimizers(self):
        opt = torch.optim.SGD(self.parameters(), lr=0.1)
        total = self.trainer.estimated_stepping_batches // self.trainer.accumulate_grad_batches
        sched = torch.optim.lr_scheduler.LambdaLR(  # expect: AG339
            opt, lambda s: 0.5 * (1 + math.cos(math.pi * min(s, total) / total)))
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


trainer = pl.Trainer(accumulate_grad_batches=3, max_epochs=2)
trainer.fit(LM(), loader)
