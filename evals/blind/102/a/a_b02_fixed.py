"""Lightning (automatic optimisation) classifier with a soft-orthogonality regulariser on the
projection layer. The regulariser is added in the `backward` hook so that the loss returned by
`training_step` (and logged) stays the plain cross-entropy."""
import argparse
import hashlib

import torch
import torch.nn as nn
import torch.nn.functional as F
import pytorch_lightning as pl


def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--in-dim", type=int, default=24)
    p.add_argument("--proj-dim", type=int, default=16)
    p.add_argument("--classes", type=int, default=5)
    p.add_argument("--micro-batch", type=int, default=8)
    p.add_argument("--accumulate", type=int, default=3)
    p.add_argument("--batches-per-rank", type=int, default=12)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--ortho-weight", type=float, default=0.05)
    return p.parse_args()


class OrthoClassifier(pl.LightningModule):
    def __init__(self, hp):
        super().__init__()
        self.save_hyperparameters(vars(hp))
        self.proj = nn.Linear(hp.in_dim, hp.proj_dim, bias=False)
        self.body = nn.Sequential(nn.LayerNorm(hp.proj_dim), nn.Linear(hp.proj_dim, 32), nn.ReLU())
        self.out = nn.Linear(32, hp.classes)

    def forward(self, x):
        return self.out(self.body(self.proj(x)))

    def ortho_penalty(self):
        w = self.proj.weight
        gram = w @ w.t()
        eye = torch.eye(gram.shape[0], dtype=gram.dtype, device=gram.device)
        return ((gram - eye) ** 2).sum()

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log("train/ce", loss, prog_bar=False)
        return loss

    def backward(self, loss, *args, **kwargs):
        # regulariser kept out of the logged task loss
        # `loss` arrives already divided by accumulate_grad_batches; scale the regulariser the same way
        reg = self.hparams.ortho_weight * self.ortho_penalty() / self.trainer.accumulate_grad_batches
        (loss + reg).backward(*args, **kwargs)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=self.hparams.lr, weight_decay=0.0)


class SynthData(pl.LightningDataModule):
    def __init__(self, hp, world_size=2):
        super().__init__()
        self.hp, self.world_size = hp, world_size

    def setup(self, stage=None):
        g = torch.Generator().manual_seed(self.hp.seed)
        n = self.hp.micro_batch * self.hp.batches_per_rank * self.world_size
        x = torch.randn(n, self.hp.in_dim, generator=g)
        w = torch.randn(self.hp.in_dim, self.hp.classes, generator=g)
        y = (x @ w + 0.5 * torch.randn(n, self.hp.classes, generator=g)).argmax(-1)
        self.ds = torch.utils.data.TensorDataset(x, y)

    def train_dataloader(self):
        return torch.utils.data.DataLoader(self.ds, batch_size=self.hp.micro_batch, shuffle=True,
                                           generator=torch.Generator().manual_seed(self.hp.seed))


def main():
    hp = parse_args()
    pl.seed_everything(hp.seed, workers=True)
    model = OrthoClassifier(hp)
    trainer = pl.Trainer(accelerator="cpu", devices=2, num_nodes=1, strategy="ddp",
                         max_epochs=hp.epochs, accumulate_grad_batches=hp.accumulate,
                         deterministic=True, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(model, datamodule=SynthData(hp))
    if trainer.global_rank == 0:
        h = hashlib.sha256()
        for _, p in model.named_parameters():
            h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)


if __name__ == "__main__":
    main()
