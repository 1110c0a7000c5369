# corpus: style=lightning class=F13
# manual optimisation accumulating K batches: the step is gated by batch_idx % K == 0 after
# the backward, and batch_idx counts from 0: the first window holds one batch
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
        if batch_idx % self.k == 0:  # expect: AG115
            opt.step()
            opt.zero_grad()

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)
