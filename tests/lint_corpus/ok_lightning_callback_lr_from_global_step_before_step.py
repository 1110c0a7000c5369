# corpus: style=lightning class=OK
# a warm-up + cosine callback sets the rate right before each optimizer step from the
# trainer's count of optimizer steps, the horizon's unit under accumulate_grad_batches
import math

import pytorch_lightning as pl
from pytorch_lightning.callbacks import Callback


class WarmupCosine(Callback):
    def __init__(self, warmup):
        self.warmup = warmup

    def on_fit_start(self, trainer, pl_module):
        self.total = int(trainer.estimated_stepping_batches)
        self.base = [g["lr"] for g in trainer.optimizers[0].param_groups]

    def scale(self, step):
        if step < self.warmup:
            return (step + 1) / self.warmup
        return 0.5 * (1 + math.cos(math.pi * min(1.0, step / self.total)))

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        step = trainer.global_step
        s = self.scale(step)
        for g, base in zip(optimizer.param_groups, self.base):
            g["lr"] = base * s


trainer = pl.Trainer(max_epochs=2, accumulate_grad_batches=3, callbacks=[WarmupCosine(5)])
trainer.fit(module, datamodule=data)
