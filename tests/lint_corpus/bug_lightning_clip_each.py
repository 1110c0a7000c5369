# corpus: style=lightning class=F8
import pytorch_lightning as pl


class ManualClip(pl.LightningModule):
    automatic_optimization = False
    accum_batches = 8

    def training_step(self, batch, batch_idx):
        opt = self.optimizers()
        loss = self.compute(batch) / self.accum_batches
        self.manual_backward(loss)
        self.clip_gradients(opt, gradient_clip_val=1.0)  # expect: AG105
        if (batch_idx + 1) % self.accum_batches == 0:
            opt.step()
            opt.zero_grad()
