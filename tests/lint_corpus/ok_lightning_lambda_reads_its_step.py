# corpus: style=lightning class=OK
import lightning.pytorch as pl
import torch


class Classifier(pl.LightningModule):
    def __init__(self, net, warmup=50):
        super().__init__()
        self.net, self.warmup = net, warmup

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.cross_entropy(self.net(x), y)

    def configure_optimizers(self):
        opt = torch.optim.AdamW(self.parameters(), lr=3e-4)
        warm = self.warmup
        sched = torch.optim.lr_scheduler.LambdaLR(
            opt, lambda step: min(1.0, (step + 1) / warm))
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def main(net, dm):
    pl.Trainer(max_epochs=3, accumulate_grad_batches=4).fit(Classifier(net), dm)
