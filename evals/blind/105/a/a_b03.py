"""Property regression with a two-optimizer LightningModule (manual optimisation).

The encoder is trained with AdamW, the read-out head with SGD + momentum, so the
module drives its optimizers itself.  Gradients are accumulated over a window of
micro-batches before both optimizers step.
"""
import hashlib
import os

import pytorch_lightning as pl
import torch
import torch.nn as nn
import torch.nn.functional as F
from pytorch_lightning.strategies import DDPStrategy
from torch.utils.data import DataLoader, TensorDataset

HPARAMS = dict(
    in_dim=20,
    width=64,
    enc_lr=2e-3,
    head_lr=5e-2,
    head_momentum=0.9,
    grad_accum=4,
    clip=1.0,
    micro_batch=8,
    epochs=2,
)


class Regressor(pl.LightningModule):
    def __init__(self, **hp):
        super().__init__()
        self.save_hyperparameters(hp)
        self.automatic_optimization = False
        self.encoder = nn.Sequential(
            nn.Linear(hp["in_dim"], hp["width"]), nn.SiLU(),
            nn.Linear(hp["width"], hp["width"]), nn.SiLU(),
        )
        self.head = nn.Linear(hp["width"], 1)

    def forward(self, x):
        return self.head(self.encoder(x)).squeeze(-1)

    def configure_optimizers(self):
        enc_opt = torch.optim.AdamW(self.encoder.parameters(), lr=self.hparams.enc_lr, weight_decay=0.01)
        head_opt = torch.optim.SGD(self.head.parameters(), lr=self.hparams.head_lr,
                                   momentum=self.hparams.head_momentum)
        updates = self.trainer.estimated_stepping_batches // self.hparams.grad_accum
        enc_sched = torch.optim.lr_scheduler.CosineAnnealingLR(enc_opt, T_max=max(1, updates))
        head_sched = torch.optim.lr_scheduler.CosineAnnealingLR(head_opt, T_max=max(1, updates))
        return [enc_opt, head_opt], [enc_sched, head_sched]

    def _accum_steps(self):
        return self.trainer.accumulate_grad_batches

    def _closes_window(self, batch_idx):
        return (batch_idx + 1) % self._accum_steps() == 0 or self.trainer.is_last_batch

    def training_step(self, batch, batch_idx):
        x, y = batch
        enc_opt, head_opt = self.optimizers()
        loss = F.smooth_l1_loss(self(x), y, beta=0.5)
        self.manual_backward(loss / self.hparams.grad_accum)
        if self._closes_window(batch_idx):
            self.clip_gradients(enc_opt, gradient_clip_val=self.hparams.clip, gradient_clip_algorithm="norm")
            enc_opt.step()
            head_opt.step()
            enc_opt.zero_grad()
            head_opt.zero_grad()
            for sched in self.lr_schedulers():
                sched.step()
        self.log("train_loss", loss.detach(), prog_bar=False)
        return loss.detach()


def make_data(hp):
    g = torch.Generator().manual_seed(11)
    x = torch.randn(192, hp["in_dim"], generator=g)      # 192 / (2 ranks * 8) = 12 micro-batches per rank
    w = torch.randn(hp["in_dim"], generator=g)
    y = torch.tanh(x @ w / 3) + 0.3 * (x[:, 0] * x[:, 1]) + 0.05 * torch.randn(192, generator=g)
    return TensorDataset(x, y)


def main():
    pl.seed_everything(2024, workers=True)
    model = Regressor(**HPARAMS)
    loader = DataLoader(make_data(HPARAMS), batch_size=HPARAMS["micro_batch"], shuffle=True)
    trainer = pl.Trainer(
        accelerator="cpu", devices=2, num_nodes=1,
        strategy=DDPStrategy(process_group_backend="gloo"),
        max_epochs=HPARAMS["epochs"], deterministic=True,
        logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
    )
    trainer.fit(model, loader)
    if trainer.global_rank == 0:
        h = hashlib.sha256()
        for _, p in model.named_parameters():
            h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
        if os.environ.get("DUMP_PARAMS"):
            torch.save({n: p.detach().float().clone() for n, p in model.named_parameters()},
                       os.environ["DUMP_PARAMS"])
        print(f"FINAL_SHA256 {h.hexdigest()}")


if __name__ == "__main__":
    main()
