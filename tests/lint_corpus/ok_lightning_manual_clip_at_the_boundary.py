# corpus: style=lightning class=OK
# manual optimisation: the clip runs once per window, inside the step branch
import pytorch_lightning as pl
import torch

K = 4


class Denoiser(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.automatic_optimization = False
        self.net = torch.nn.Linear(16, 16)

    def _backward(self, loss):
        self.manual_backward(loss)

    def training_step(self, batch, batch_idx):
        opt = self.optimizers()
        x, y = batch
        self._backward(torch.nn.functional.mse_loss(self.net(x), y) / K)
        if (batch_idx + 1) % K == 0:
            self.clip_gradients(opt, gradient_clip_val=1.0, gradient_clip_algorithm="norm")
            opt.step()
            opt.zero_grad()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)
