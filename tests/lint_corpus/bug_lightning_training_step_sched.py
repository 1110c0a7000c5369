# corpus: style=lightning class=F4
# the LightningModule steps its scheduler by hand inside training_step under automatic
# optimisation: with accumulate_grad_batches=4 the schedule advances 4 times per optimizer step
import lightning.pytorch as pl
import torch


class Net(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.model = torch.nn.Linear(16, 2)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.cross_entropy(self.model(x), y)
        self.lr_schedulers().step()  # expect: AG119
        self.log("lr", self.lr_schedulers().get_last_lr()[0])
        return loss

    def configure_optimizers(self):
        opt = torch.optim.AdamW(self.parameters(), lr=1e-3)
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=1000)
        return [opt], [sched]


trainer = pl.Trainer(max_epochs=3, accumulate_grad_batches=4)
trainer.fit(Net(), train_loader)
