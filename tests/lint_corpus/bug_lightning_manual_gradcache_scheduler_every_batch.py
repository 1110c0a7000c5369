# corpus: style=lightning class=F4
# GradCache-style manual optimisation: the window's backwards all run at the boundary, but
# the scheduler is stepped on every training_step, K times per optimizer step
import lightning.pytorch as pl
import torch


class Contrastive(pl.LightningModule):
    def __init__(self, encoder, hp):
        super().__init__()
        self.encoder, self.hp = encoder, hp
        self.automatic_optimization = False
        self.cache = []

    def training_step(self, batch, batch_idx):
        opt = self.optimizers()
        sch = self.lr_schedulers()
        K = self.hp["accum"]
        self.cache.append(batch)
        if (batch_idx + 1) % K == 0:
            with torch.no_grad():
                z = torch.cat([self.encoder(b) for b in self.cache])
            z.requires_grad_(True)
            loss = torch.nn.functional.cross_entropy(z @ z.T, torch.arange(len(z)))
            self.manual_backward(loss)
            for b, g in zip(self.cache, z.grad.split([len(b) for b in self.cache])):
                self.manual_backward((self.encoder(b) * g).sum())
            opt.step()
            opt.zero_grad()
            self.cache.clear()
        sch.step()  # expect: AG103

    def configure_optimizers(self):
        opt = torch.optim.AdamW(self.parameters(), lr=1e-3)
        return [opt], [torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 10))]
