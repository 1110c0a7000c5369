"""Lightning manual optimisation: backbone + head with separate optimizers, K micro-batches per update."""
import hashlib

import pytorch_lightning as pl
import torch
import torch.nn as nn
import torch.nn.functional as F
from pytorch_lightning.strategies import DDPStrategy
from torch.utils.data import DataLoader, TensorDataset

K = 3
BATCH = 3
N = 54          # 27 per rank -> 9 micro-batches -> 3 windows per epoch
EPOCHS = 3


class TwoOptModule(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.automatic_optimization = False
        self.backbone = nn.Sequential(nn.Linear(10, 48), nn.Tanh(), nn.Linear(48, 24), nn.Tanh())
        self.head = nn.Linear(24, 3)

    def training_step(self, batch, batch_idx):
        opt_bb, opt_head = self.optimizers()
        sch_bb, sch_head = self.lr_schedulers()
        x, y = batch
        loss = F.cross_entropy(self.head(self.backbone(x)), y)
        self.manual_backward(loss / K)
        if (batch_idx + 1) % K == 0:
            self.clip_gradients(opt_bb, gradient_clip_val=0.4, gradient_clip_algorithm="norm")
            self.clip_gradients(opt_head, gradient_clip_val=0.4, gradient_clip_algorithm="norm")
            opt_bb.step()
            opt_head.step()
            opt_bb.zero_grad()
            opt_head.zero_grad()
            sch_bb.step()
            sch_head.step()
        self.log("loss", loss)

    def configure_optimizers(self):
        opt_bb = torch.optim.AdamW(self.backbone.parameters(), lr=3e-3, weight_decay=0.01)
        opt_head = torch.optim.Adam(self.head.parameters(), lr=1e-2)
        total = EPOCHS * (N // (2 * BATCH)) // K
        sch_bb = torch.optim.lr_scheduler.LambdaLR(opt_bb, lambda s: 1.0 - s / (total + 1))
        sch_head = torch.optim.lr_scheduler.StepLR(opt_head, step_size=3, gamma=0.5)
        return [opt_bb, opt_head], [sch_bb, sch_head]


def main():
    pl.seed_everything(21, workers=True)
    g = torch.Generator().manual_seed(21)
    x = torch.randn(N, 10, generator=g)
    y = (x[:, 0] * 2 + x[:, 1] - x[:, 2] > 0).long() + (x[:, 3] > 0.8).long()
    loader = DataLoader(TensorDataset(x, y), batch_size=BATCH, shuffle=True)
    model = TwoOptModule()
    trainer = pl.Trainer(accelerator="cpu", devices=2, strategy=DDPStrategy(process_group_backend="gloo"),
                         max_epochs=EPOCHS, deterministic=True, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(model, loader)
    if trainer.is_global_zero:
        h = hashlib.sha256()
        for _, p in model.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        print("FINAL_SHA256", h.hexdigest())


if __name__ == "__main__":
    main()
