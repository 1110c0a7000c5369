# corpus: style=lightning class=F3
# validation_step runs a saliency backward and clears the weights' gradients; validation runs
# every 6 training batches, not a multiple of K = 4, so it lands inside a window
import lightning.pytorch as pl
import torch


class Net(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.body = torch.nn.Linear(16, 4)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.cross_entropy(self.body(x), y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        with torch.enable_grad():
            x = x.clone().requires_grad_(True)
            self.body(x).max(-1).values.sum().backward()
            self.log("saliency", x.grad.abs().mean())
            self.zero_grad(set_to_none=True)  # expect: AG192

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


pl.Trainer(max_epochs=2, accumulate_grad_batches=4, val_check_interval=6).fit(Net(), train, val)
