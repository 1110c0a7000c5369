# corpus: style=lightning class=OK
import lightning as L


class LitModel(L.LightningModule):
    def __init__(self, accumulate_grad_batches: int = 4):
        super().__init__()
        self.automatic_optimization = False
        self.n_accum = accumulate_grad_batches

    def training_step(self, batch, batch_idx):
        opt = self.optimizers()
        sch = self.lr_schedulers()
        loss = self.compute_loss(batch) / self.n_accum
        self.manual_backward(loss)
        if (batch_idx + 1) % self.n_accum == 0:
            self.clip_gradients(opt, gradient_clip_val=0.5, gradient_clip_algorithm="norm")
            opt.step()
            sch.step()
            opt.zero_grad()
        return loss
