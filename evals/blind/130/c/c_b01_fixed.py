"""Lightning DDP regression with an orthogonality regulariser on the projection.

K = 4 micro-batches per optimizer step (Trainer(accumulate_grad_batches=4)).
The regulariser is applied in the LightningModule.backward hook so that the
logged training loss stays the pure task loss.
"""
import hashlib
import os

import torch
import torch.nn as nn
import torch.nn.functional as F
import pytorch_lightning as pl
from torch.utils.data import DataLoader, TensorDataset

ACCUM = 4
MICRO_BS = 4
EPOCHS = 3
ORTHO_WEIGHT = 0.05


def make_data(n=64, d_in=16, seed=7):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d_in, generator=g)
    w = torch.randn(d_in, 4, generator=g)
    y = torch.tanh(x @ w) + 0.1 * torch.randn(n, 4, generator=g)
    return TensorDataset(x, y)


class OrthoRegressor(pl.LightningModule):
    def __init__(self, d_in=16, d_hid=32, d_out=4, lr=3e-3):
        super().__init__()
        self.save_hyperparameters()
        self.proj = nn.Linear(d_in, d_hid, bias=False)
        self.mlp = nn.Sequential(nn.GELU(), nn.Linear(d_hid, d_hid), nn.GELU())
        self.head = nn.Linear(d_hid, d_out)

    def forward(self, x):
        return self.head(self.mlp(self.proj(x)))

    def ortho_penalty(self):
        w = self.proj.weight  # (d_hid, d_in)
        gram = w.t() @ w
        eye = torch.eye(gram.shape[0], device=gram.device)
        return ((gram - eye) ** 2).sum()

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.mse_loss(self(x), y)
        self.log("train_mse", loss, prog_bar=False)
        return loss

    def backward(self, loss, *args, **kwargs):
        # keep the regulariser out of the logged loss
        # Lightning already divided `loss` by K; the penalty must follow suit
        loss = loss + ORTHO_WEIGHT * self.ortho_penalty() / self.trainer.accumulate_grad_batches
        loss.backward(*args, **kwargs)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=self.hparams.lr, weight_decay=0.0)


def params_sha(module):
    h = hashlib.sha256()
    for _, p in module.named_parameters():
        h.update(p.detach().cpu().float().contiguous().numpy().tobytes())
    return h.hexdigest()


def main():
    pl.seed_everything(1234, workers=True)
    torch.use_deterministic_algorithms(True)
    model = OrthoRegressor()
    loader = DataLoader(make_data(), batch_size=MICRO_BS, shuffle=False)
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        max_epochs=EPOCHS,
        accumulate_grad_batches=ACCUM,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        deterministic=True,
    )
    trainer.fit(model, loader)
    if trainer.global_rank == 0:
        if os.environ.get("PARAM_DUMP"):
            torch.save({n: p.detach().clone() for n, p in model.named_parameters()}, os.environ["PARAM_DUMP"])
        print("FINAL_SHA256", params_sha(model), flush=True)


if __name__ == "__main__":
    main()
