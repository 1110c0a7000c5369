"""Sequence classifier (GRU) trained with PyTorch Lightning on 2 DDP ranks,
gradient accumulation through the Trainer, linear warm-up/decay per optimizer step.
"""
import hashlib

import pytorch_lightning as pl
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset


class SeqClassifier(pl.LightningModule):
    def __init__(self, vocab=40, dim=32, n_classes=5, lr=2e-3, warmup_steps=3, grad_accum=3):
        super().__init__()
        self.save_hyperparameters()
        self.emb = nn.Embedding(vocab, dim)
        self.rnn = nn.GRU(dim, dim, batch_first=True)
        self.head = nn.Linear(dim, n_classes)

    def forward(self, x):
        out, _ = self.rnn(self.emb(x))
        return self.head(out.mean(dim=1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log("train_loss", loss, prog_bar=False)
        return loss

    def configure_optimizers(self):
        opt = torch.optim.AdamW(self.parameters(), lr=self.hparams.lr, weight_decay=0.01)
        total = self.trainer.estimated_stepping_batches
        warm = self.hparams.warmup_steps

        def lr_lambda(step):
            if step < warm:
                return (step + 1) / warm
            return max(0.0, (total - step) / max(1, total - warm))

        sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda)
        return {
            "optimizer": opt,
            "lr_scheduler": {"scheduler": sched, "interval": "step",
                             "frequency": self.hparams.grad_accum},
        }


def make_data(n=72, seq=12, vocab=40, n_classes=5):
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, vocab, (n, seq), generator=g)
    y = (x[:, :3].sum(dim=1) + x[:, -1]) % n_classes
    return TensorDataset(x, y)


def main():
    pl.seed_everything(7, workers=True)
    grad_accum = 3
    model = SeqClassifier(grad_accum=grad_accum)
    loader = DataLoader(make_data(), batch_size=4, shuffle=True)
    trainer = pl.Trainer(
        accelerator="cpu", devices=2, num_nodes=1, strategy="ddp",
        max_epochs=4, accumulate_grad_batches=grad_accum,
        deterministic=True, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False,
    )
    trainer.fit(model, loader)
    if trainer.global_rank == 0:
        print(f"optimizer steps: {trainer.global_step}")
        flat = torch.cat([p.detach().float().reshape(-1) for _, p in model.named_parameters()])
        print(f"FINAL_SHA256 {hashlib.sha256(flat.numpy().tobytes()).hexdigest()}")


if __name__ == "__main__":
    main()
