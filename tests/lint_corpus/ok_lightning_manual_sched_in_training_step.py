# corpus: style=lightning class=OK
# manual optimisation: the module steps optimizer and scheduler together every K batches;
# Lightning's accumulate_grad_batches does not apply (and is left at 1)
import lightning.pytorch as pl
import torch

K = 4


class Net(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.automatic_optimization = False
        self.model = torch.nn.Linear(16, 2)

    def training_step(self, batch, batch_idx):
        opt = self.optimizers()
        sched = self.lr_schedulers()
        x, y = batch
        loss = torch.nn.functional.cross_entropy(self.model(x), y) / K
        self.manual_backward(loss)
        if (batch_idx + 1) % K == 0:
            opt.step()
            opt.zero_grad()
            sched.step()

    def configure_optimizers(self):
        opt = torch.optim.AdamW(self.parameters(), lr=1e-3)
        return [opt], [torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=1000)]


pl.Trainer(max_epochs=3).fit(Net(), train_loader)
