# corpus: style=lightning class=F1
import lightning as L


class LitModel(L.LightningModule):
    def __init__(self, accumulate_grad_batches: int = 4):
        super().__init__()
        self.automatic_optimization = False
        self.accumulate_grad_batches = accumulate_grad_batches

    def training_step(self, batch, batch_idx):
        opt = self.optimizers()
        loss = self.compute_loss(batch) / self.accumulate_grad_batches
        self.manual_backward(loss)
        opt.step()  # expect: AG101
        opt.zero_grad()
