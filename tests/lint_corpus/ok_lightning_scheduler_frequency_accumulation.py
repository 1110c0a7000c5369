# corpus: style=lightning class=OK
import pytorch_lightning as pl
import torch

ACCUM = 4


class LitRegressor(pl.LightningModule):
    def __init__(self, net):
        super().__init__()
        self.net = net

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.log("train/loss", loss)
        return loss

    def configure_optimizers(self):
        optimizer = torch.optim.AdamW(self.parameters(), lr=1e-3, weight_decay=0.01)
        total = self.trainer.estimated_stepping_batches
        warmup = int(0.05 * total)

        def lr_lambda(step):
            if step < warmup:
                return (step + 1) / warmup
            return max(0.0, (total - step) / (total - warmup))

        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda)
        return {
            "optimizer": optimizer,
            "lr_scheduler": {
                "scheduler": scheduler,
                "interval": "step",
                # Lightning counts a step scheduler's frequency in batches (batch_idx + 1) and
                # updates it only when the optimizer steps: K is once per optimizer step
                "frequency": self.trainer.accumulate_grad_batches,
            },
        }


trainer = pl.Trainer(max_epochs=20, accumulate_grad_batches=ACCUM, gradient_clip_val=1.0)
trainer.fit(LitRegressor(torch.nn.Linear(16, 1)), datamodule=dm)
