# corpus: style=lightning class=F4
# a warm-up callback writes the learning rate from batch_idx, which counts micro-batches under
# accumulate_grad_batches: the warm-up advances accumulate_grad_batches positions per step
import pytorch_lightning as pl
from pytorch_lightning.callbacks import Callback


class LinearWarmup(Callback):
    def __init__(self, base_lr, warmup_steps):
        self.base_lr, self.warmup_steps = base_lr, warmup_steps

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        step = batch_idx
        scale = min(1.0, (step + 1) / self.warmup_steps)
        for opt in trainer.optimizers:
            for pg in opt.param_groups:
                pg["lr"] = self.base_lr * scale  # expect: AG130


trainer = pl.Trainer(max_steps=100, accumulate_grad_batches=4, callbacks=[LinearWarmup(1e-3, 10)])
trainer.fit(module, datamodule=data)
