# corpus: style=lightning class=OK
# a warm-up callback writes the learning rate from trainer.global_step, which counts optimizer
# steps under accumulate_grad_batches
import pytorch_lightning as pl
from pytorch_lightning.callbacks import Callback


class LinearWarmup(Callback):
    def __init__(self, base_lr, warmup_steps):
        self.base_lr, self.warmup_steps = base_lr, warmup_steps

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        step = trainer.global_step
        scale = min(1.0, (step + 1) / self.warmup_steps)
        for opt in trainer.optimizers:
            for pg in opt.param_groups:
                pg["lr"] = self.base_lr * scale


trainer = pl.Trainer(max_steps=100, accumulate_grad_batches=4, callbacks=[LinearWarmup(1e-3, 10)])
trainer.fit(module, datamodule=data)
