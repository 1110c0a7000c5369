# corpus: style=lightning class=OK
# the scheduler is stepped in training_step only on the batch that closes a window of
# accumulate_grad_batches (the optimizer's own boundary)
import lightning.pytorch as pl
import torch

ACCUM = 4


class Net(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.model = torch.nn.Linear(16, 2)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.cross_entropy(self.model(x), y)
        if (batch_idx + 1) % self.trainer.accumulate_grad_batches == 0:
            self.lr_schedulers().step()
        return loss

    def configure_optimizers(self):
        opt = torch.optim.AdamW(self.parameters(), lr=1e-3)
        return [opt], [torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=1000)]


pl.Trainer(max_epochs=3, accumulate_grad_batches=ACCUM).fit(Net(), train_loader)
