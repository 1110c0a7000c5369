# corpus: style=lightning class=F1
import pytorch_lightning as pl


class Manual(pl.LightningModule):
    def __init__(self, accumulate_n=4):
        super().__init__()
        self.automatic_optimization = False
        self.accumulate_n = accumulate_n

    def training_step(self, batch, batch_idx):
        opt = self.optimizers()
        loss = self.compute(batch) / self.accumulate_n
        self.manual_backward(loss)
        opt.step()  # expect: AG101
        opt.zero_grad()
