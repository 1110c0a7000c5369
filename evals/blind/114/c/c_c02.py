"""Lightning DDP (2 CPU processes), automatic optimisation with accumulate_grad_batches=3.

A small transformer classifier whose token table is grown by 10 rows before fit (new
special tokens), AdamW with decay / no-decay groups, a per-optimizer-step warm-up + linear
decay sized from trainer.estimated_stepping_batches, norm clipping that acts, a worker
DataLoader and 12-batch epochs (four full windows each).
"""
import hashlib

import pytorch_lightning as pl
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

HP = dict(vocab=100, extra_tokens=10, dim=32, seq=12, n_cls=5, batch=8, accum=3,
          epochs=2, lr=3e-3, warmup=2, clip=0.5, seed=3)


class Classifier(pl.LightningModule):
    def __init__(self, vocab, extra_tokens, dim, seq, n_cls, lr, warmup, **_):
        super().__init__()
        self.save_hyperparameters()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(torch.zeros(seq, dim))
        layer = nn.TransformerEncoderLayer(dim, 4, 64, dropout=0.0, batch_first=True)
        self.enc = nn.TransformerEncoder(layer, 1, enable_nested_tensor=False)
        self.cls = nn.Linear(dim, n_cls)

    def grow_vocab(self, extra):
        old = self.tok
        new = nn.Embedding(old.num_embeddings + extra, old.embedding_dim)
        with torch.no_grad():
            new.weight[: old.num_embeddings] = old.weight
            new.weight[old.num_embeddings:] = old.weight.mean(0, keepdim=True)
        self.tok = new

    def forward(self, x):
        h = self.enc(self.tok(x) + self.pos)
        return self.cls(h.mean(1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.cross_entropy(self(x), y)

    def configure_optimizers(self):
        decay = [p for n, p in self.named_parameters() if p.dim() >= 2 and n != "pos"]
        rest = [p for n, p in self.named_parameters() if not (p.dim() >= 2 and n != "pos")]
        opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.05},
                                 {"params": rest, "weight_decay": 0.0}], lr=self.hparams.lr)
        total = self.trainer.estimated_stepping_batches
        warm = self.hparams.warmup

        def lr_lambda(step):
            if step < warm:
                return (step + 1) / warm
            return max(0.0, (total - step) / max(1, total - warm))

        sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def dataset(n):
    g = torch.Generator().manual_seed(HP["seed"])
    x = torch.randint(0, HP["vocab"] + HP["extra_tokens"], (n, HP["seq"]), generator=g)
    x[:, 0] = HP["vocab"] + torch.randint(0, HP["extra_tokens"], (n,), generator=g)  # special
    y = (x[:, 0] + x[:, 1:4].sum(1)) % HP["n_cls"]
    return TensorDataset(x, y)


def main():
    pl.seed_everything(HP["seed"], workers=True)
    model = Classifier(**HP)
    model.grow_vocab(HP["extra_tokens"])
    loader = DataLoader(dataset(2 * 12 * HP["batch"]), batch_size=HP["batch"], shuffle=False,
                        num_workers=1, persistent_workers=True)
    trainer = pl.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=HP["epochs"],
                         accumulate_grad_batches=HP["accum"], gradient_clip_val=HP["clip"],
                         gradient_clip_algorithm="norm", deterministic=True, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False)
    trainer.fit(model, loader)
    flat = torch.cat([p.detach().float().reshape(-1) for _, p in model.named_parameters()])
    if trainer.global_rank == 0:
        print(f"optimizer steps {trainer.global_step}")
        print("FINAL_SHA256", hashlib.sha256(flat.numpy().tobytes()).hexdigest())


if __name__ == "__main__":
    main()
