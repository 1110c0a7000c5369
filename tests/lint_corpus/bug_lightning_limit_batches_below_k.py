# corpus: style=lightning class=F7
# a quick smoke configuration kept for the real run: 2 batches per epoch, accumulation of 8
import lightning as L
import torch
import torch.nn.functional as F

ACCUM = 8
SMOKE_BATCHES = 2


class Regressor(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.head = torch.nn.Linear(16, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.mse_loss(self.head(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


trainer = L.Trainer(max_epochs=20, limit_train_batches=SMOKE_BATCHES,  # expect: AG131
                    accumulate_grad_batches=ACCUM, accelerator="cpu")
trainer.fit(Regressor(), train_loader)
