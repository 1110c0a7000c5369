"""Lightning text classifier with adaptive gradient clipping (AGC, NFNet-style).

2 CPU ranks (DDP), accumulate_grad_batches=4.
"""
import argparse
import hashlib

import torch
import torch.nn as nn
import torch.nn.functional as F
import pytorch_lightning as pl
from torch.utils.data import DataLoader, TensorDataset


def parse_args():
    ap = argparse.ArgumentParser()
    ap.add_argument("--vocab", type=int, default=200)
    ap.add_argument("--seq-len", type=int, default=24)
    ap.add_argument("--n-classes", type=int, default=5)
    ap.add_argument("--n-samples", type=int, default=256)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--accumulate", type=int, default=4)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--lr", type=float, default=0.3)
    ap.add_argument("--agc-clip", type=float, default=0.01)
    ap.add_argument("--seed", type=int, default=7)
    return ap.parse_args()


def adaptive_clip_(p, clip=0.02, eps=1e-3):
    """Per-tensor AGC: ||g|| <= clip * max(||w||, eps) per tensor."""
    g = p.grad
    w_norm = p.detach().norm().clamp_min(eps)
    g_norm = g.detach().norm()
    max_norm = clip * w_norm
    if g_norm > max_norm:
        g.mul_(max_norm / (g_norm + 1e-6))


class BagOfWordsClassifier(pl.LightningModule):
    def __init__(self, args):
        super().__init__()
        self.save_hyperparameters(vars(args))
        self.emb = nn.Embedding(args.vocab, 32)
        self.mlp = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, args.n_classes))

    def forward(self, tokens):
        return self.mlp(self.emb(tokens).mean(1))

    def training_step(self, batch, batch_idx):
        tokens, labels = batch
        loss = F.cross_entropy(self(tokens), labels)
        self.log("train_loss", loss, prog_bar=False)
        return loss

    def on_fit_start(self):
        # AGC: rescale each tensor's gradient as soon as it is accumulated into .grad
        for p in self.parameters():
            if p.requires_grad:
                p.register_post_accumulate_grad_hook(lambda t: adaptive_clip_(t, self.hparams.agc_clip))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=0.9)


def make_data(args):
    g = torch.Generator().manual_seed(args.seed)
    tokens = torch.randint(0, args.vocab, (args.n_samples, args.seq_len), generator=g)
    labels = (tokens[:, :4].sum(1) % args.n_classes)
    return TensorDataset(tokens, labels)


def param_sha(model):
    h = hashlib.sha256()
    for _, p in model.named_parameters():
        h.update(p.detach().to(torch.float32).contiguous().numpy().tobytes())
    return h.hexdigest()


def main():
    args = parse_args()
    pl.seed_everything(args.seed, workers=True)
    model = BagOfWordsClassifier(args)
    loader = DataLoader(make_data(args), batch_size=args.batch_size, shuffle=True)
    trainer = pl.Trainer(
        accelerator="cpu", devices=2, strategy="ddp", max_epochs=args.epochs,
        accumulate_grad_batches=args.accumulate, deterministic=True,
        logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model, loader)
    sha = param_sha(model)
    if trainer.global_rank == 0:
        print(f"FINAL_SHA256 {sha}")


if __name__ == "__main__":
    main()
