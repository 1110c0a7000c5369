# corpus: style=lightning class=OK
"""Lightning manual optimisation, two optimizers, a window of K batches decided by a helper."""
import lightning.pytorch as pl
import torch
import torch.nn.functional as F

K = 4


class Model(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.automatic_optimization = False
        self.body = torch.nn.Linear(16, 32)
        self.head = torch.nn.Linear(32, 4)

    def forward(self, x):
        return self.head(torch.relu(self.body(x)))

    def configure_optimizers(self):
        return [torch.optim.AdamW(self.body.parameters(), lr=1e-3),
                torch.optim.SGD(self.head.parameters(), lr=1e-2)]

    def window_done(self, batch_idx):
        return (batch_idx + 1) % K == 0

    def training_step(self, batch, batch_idx):
        x, y = batch
        opt_body, opt_head = self.optimizers()
        self.manual_backward(F.cross_entropy(self(x), y) / K)
        if self.window_done(batch_idx):
            opt_body.step()
            opt_body.zero_grad()
            opt_head.step()
            opt_head.zero_grad()
