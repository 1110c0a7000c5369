"""Lightning DDP classifier with input-saliency monitoring during validation.

Validation runs several times per epoch (``val_check_interval``) and logs how
much the predicted class depends on the inputs (mean |d score / d x|).
Launched with torchrun; Lightning picks the ranks up from the environment.
"""
import argparse
import hashlib

import torch
import torch.nn as nn
import torch.nn.functional as F
import pytorch_lightning as pl
from torch.utils.data import DataLoader, TensorDataset


def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("--in-dim", type=int, default=32)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--accumulate", type=int, default=4)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--val-every", type=int, default=6, help="training batches between val runs")
    p.add_argument("--seed", type=int, default=7)
    return p.parse_args()


def make_split(n, in_dim, classes, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, in_dim, generator=g)
    w = torch.randn(in_dim, classes, generator=g)
    y = (x @ w + 0.3 * torch.randn(n, classes, generator=g)).argmax(1)
    return TensorDataset(x, y)


class SaliencyClassifier(pl.LightningModule):
    def __init__(self, in_dim, hidden, classes, lr):
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(
            nn.Linear(in_dim, hidden), nn.GELU(),
            nn.Linear(hidden, hidden), nn.GELU(),
            nn.Linear(hidden, classes),
        )

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        with torch.enable_grad():
            x = x.clone().requires_grad_(True)
            logits = self(x)
            score = logits.gather(1, y[:, None]).sum()
            score.backward()
            saliency = x.grad.abs().mean()
            self.zero_grad(set_to_none=True)  # saliency pass must not leave grads on the weights
        acc = (logits.argmax(1) == y).float().mean()
        self.log_dict({"val_acc": acc, "val_saliency": saliency}, sync_dist=True)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=0.9)


def params_sha256(module):
    h = hashlib.sha256()
    for _, p in module.named_parameters():
        h.update(p.detach().float().contiguous().numpy().tobytes())
    return h.hexdigest()


def main():
    args = parse_args()
    pl.seed_everything(args.seed, workers=True)
    world = 2
    n_train = world * args.batch_size * 16          # 16 micro-batches per rank per epoch
    train_ds = make_split(n_train, args.in_dim, args.classes, args.seed)
    val_ds = make_split(64, args.in_dim, args.classes, args.seed + 1)
    model = SaliencyClassifier(args.in_dim, args.hidden, args.classes, args.lr)

    trainer = pl.Trainer(
        accelerator="cpu", devices=world, num_nodes=1, strategy="ddp",
        max_epochs=args.epochs,
        accumulate_grad_batches=args.accumulate,
        val_check_interval=args.val_every,
        num_sanity_val_steps=0,
        inference_mode=False,        # the saliency pass needs autograd in validation
        deterministic=True,
        logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(
        model,
        train_dataloaders=DataLoader(train_ds, batch_size=args.batch_size, shuffle=True),
        val_dataloaders=DataLoader(val_ds, batch_size=16),
    )
    if trainer.is_global_zero:
        print(f"FINAL_SHA256 {params_sha256(model)}", flush=True)


if __name__ == "__main__":
    main()
