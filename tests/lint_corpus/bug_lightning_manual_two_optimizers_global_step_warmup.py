# corpus: style=lightning class=F4
"""Encoder and head trained with their own optimizers in manual optimisation, accumulating
two batches per update; a linear warm-up set by hand."""
import lightning.pytorch as pl
import torch

K = 2
WARMUP = 100


class TwoRates(pl.LightningModule):
    def __init__(self, enc, head):
        super().__init__()
        self.enc, self.head = enc, head
        self.automatic_optimization = False

    def configure_optimizers(self):
        return [torch.optim.AdamW(self.enc.parameters(), lr=1e-4),
                torch.optim.AdamW(self.head.parameters(), lr=1e-3)]

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.cross_entropy(self.head(self.enc(x)), y) / K
        self.manual_backward(loss)
        if (batch_idx + 1) % K == 0:
            scale = min(1.0, (self.trainer.global_step + 1) / WARMUP)  # expect: AG163
            for opt, base in zip(self.optimizers(), (1e-4, 1e-3)):
                for group in opt.optimizer.param_groups:
                    group["lr"] = base * scale
                opt.step()
                opt.zero_grad()
