# corpus: style=lightning class=OK
import pytorch_lightning as pl


class ManualAccum(pl.LightningModule):
    def __init__(self, n_accum=4):
        super().__init__()
        self.automatic_optimization = False
        self.n_accum = n_accum

    def training_step(self, batch, batch_idx):
        opt = self.optimizers()
        sch = self.lr_schedulers()
        loss = self.compute(batch) / self.n_accum
        self.manual_backward(loss)
        if (batch_idx + 1) % self.n_accum == 0:
            self.clip_gradients(opt, gradient_clip_val=1.0, gradient_clip_algorithm="norm")
            opt.step()
            sch.step()
            opt.zero_grad()
