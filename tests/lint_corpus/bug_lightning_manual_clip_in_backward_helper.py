# corpus: style=lightning class=F8
# manual optimisation: the backward helper clips after every manual_backward, while the
# optimizer steps every K batches
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
        self.clip_gradients(self.optimizers(), gradient_clip_val=1.0, gradient_clip_algorithm="norm")  # expect: AG105

    def training_step(self, batch, batch_idx):
        opt = self.optimizers()
        x, y = batch
        self._backward(torch.nn.functional.mse_loss(self.net(x), y) / K)
        if (batch_idx + 1) % K == 0:
            opt.step()
            opt.zero_grad()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)
