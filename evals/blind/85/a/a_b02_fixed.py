"""PyTorch Lightning: a small 1-D conv sequence classifier, DDP on 2 CPU processes,
accumulate_grad_batches=4, SGD with Nesterov momentum and a step-wise cosine schedule."""
import argparse
import hashlib
import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset
import pytorch_lightning as pl


def get_args():
    p = argparse.ArgumentParser()
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--n", type=int, default=320)
    p.add_argument("--seq-len", type=int, default=20)
    p.add_argument("--vocab", type=int, default=50)
    p.add_argument("--classes", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=5)
    p.add_argument("--accumulate", type=int, default=4)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--lr", type=float, default=0.1)
    return p.parse_args()


class ToySeqs(Dataset):
    def __init__(self, n, seq_len, vocab, classes, seed):
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randint(0, vocab, (n, seq_len), generator=g)
        self.y = (self.x[:, :4].sum(1) + self.x[:, -1]) % classes

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


class ConvClassifier(pl.LightningModule):
    def __init__(self, vocab, classes, lr, total_steps):
        super().__init__()
        self.save_hyperparameters()
        self.emb = nn.Embedding(vocab, 32)
        self.conv = nn.Conv1d(32, 48, kernel_size=3, padding=1)
        self.head = nn.Linear(48, classes)

    def forward(self, x):
        h = self.emb(x).transpose(1, 2)
        h = F.relu(self.conv(h)).max(dim=-1).values
        return self.head(h)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log("train_loss", loss, prog_bar=False)
        # Lightning scales the loss for gradient accumulation itself
        return loss

    def configure_optimizers(self):
        opt = torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=0.9, nesterov=True)
        total = self.hparams.total_steps
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.5 * (1 + math.cos(math.pi * min(s, total) / total)))
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def params_sha(model):
    h = hashlib.sha256()
    for _, p in model.named_parameters():
        h.update(p.detach().to(torch.float32).contiguous().cpu().numpy().tobytes())
    return h.hexdigest()


def main():
    args = get_args()
    pl.seed_everything(args.seed, workers=True)
    ds = ToySeqs(args.n, args.seq_len, args.vocab, args.classes, args.seed)
    loader = DataLoader(ds, batch_size=args.batch_size, shuffle=True)
    world = 2
    steps_per_epoch = math.ceil(len(ds) / (args.batch_size * world) / args.accumulate)
    model = ConvClassifier(args.vocab, args.classes, args.lr, steps_per_epoch * args.epochs)
    trainer = pl.Trainer(
        accelerator="cpu", devices=2, strategy="ddp", max_epochs=args.epochs,
        accumulate_grad_batches=args.accumulate, deterministic=True,
        logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model, loader)
    if trainer.global_rank == 0:
        print(f"global_step {trainer.global_step}")
        print(f"FINAL_SHA256 {params_sha(model)}")


if __name__ == "__main__":
    main()
