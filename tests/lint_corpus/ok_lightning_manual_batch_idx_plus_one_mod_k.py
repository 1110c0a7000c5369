# corpus: style=lightning class=OK
# manual optimisation accumulating K batches: the step is gated by (batch_idx + 1) % K == 0
# after the backward: batch_idx counts from 0, so every window holds K batches
import pytorch_lightning as pl
import torch
import torch.nn.functional as F


class Model(pl.LightningModule):
    def __init__(self, net, k=4):
        super().__init__()
        self.net = net
        self.k = k
        self.automatic_optimization = False

    def training_step(self, batch, batch_idx):
        opt = self.optimizers()
        x, y = batch
        loss = F.cross_entropy(self.net(x), y)
        self.manual_backward(loss / self.k)
        if (batch_idx + 1) % self.k == 0:
            opt.step()
            opt.zero_grad()

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)
