# corpus: style=lightning class=F8
# Lightning manual optimisation clipping on the window's last micro-batch before its
# manual_backward: the clip sees the first K-1 micro-batches only
import lightning.pytorch as pl
import torch.nn.functional as F


class Model(pl.LightningModule):
    def __init__(self, accum=4, clip=1.0):
        super().__init__()
        self.automatic_optimization = False
        self.accum, self.clip = accum, clip

    def training_step(self, batch, batch_idx):
        opt = self.optimizers()
        x, y = batch
        loss = F.cross_entropy(self(x), y) / self.accum
        last = (batch_idx + 1) % self.accum == 0
        if last:
            self.clip_gradients(opt, gradient_clip_val=self.clip, gradient_clip_algorithm="norm")  # expect: AG311
        self.manual_backward(loss)
        if last:
            opt.step()
            opt.zero_grad()
