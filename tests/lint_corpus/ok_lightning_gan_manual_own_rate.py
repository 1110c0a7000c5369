# corpus: style=lightning class=OK
# manual optimisation: the discriminator steps every batch, the generator accumulates 4
import pytorch_lightning as pl
import torch


class GAN(pl.LightningModule):
    def __init__(self, gen, disc, accumulate_batches=4):
        super().__init__()
        self.automatic_optimization = False
        self.gen, self.disc = gen, disc
        self.accumulate_batches = accumulate_batches

    def training_step(self, batch, batch_idx):
        x, z = batch
        opt_g, opt_d = self.optimizers()
        opt_d.zero_grad()
        loss_d = bce(self.disc(x), ones) + bce(self.disc(self.gen(z).detach()), zeros)
        self.manual_backward(loss_d)
        opt_d.step()
        loss_g = bce(self.disc(self.gen(z)), ones) / self.accumulate_batches
        self.manual_backward(loss_g)
        if (batch_idx + 1) % self.accumulate_batches == 0:
            opt_g.step()
            opt_g.zero_grad()

    def configure_optimizers(self):
        return [torch.optim.Adam(self.gen.parameters()), torch.optim.Adam(self.disc.parameters())]
