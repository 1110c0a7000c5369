"""Sequence classifier trained with Lightning manual optimisation and a hand-rolled accumulation window.

Launch: torchrun --nproc-per-node 2 ... a_b03.py
"""
import hashlib

import pytorch_lightning as pl
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

ACCUM = 4
CLIP_NORM = 0.05


class ConvTagger(pl.LightningModule):
    def __init__(self, vocab=40, dim=32, n_cls=3, lr=0.2, accum=ACCUM, clip=CLIP_NORM):
        super().__init__()
        self.save_hyperparameters()
        self.automatic_optimization = False
        self.emb = nn.Embedding(vocab, dim)
        self.conv = nn.Conv1d(dim, dim, kernel_size=3, padding=1)
        self.out = nn.Linear(dim, n_cls)

    def forward(self, tokens):
        h = self.emb(tokens).transpose(1, 2)
        h = F.relu(self.conv(h)).mean(-1)
        return self.out(h)

    def training_step(self, batch, batch_idx):
        opt = self.optimizers()
        tokens, labels = batch
        loss = F.cross_entropy(self(tokens), labels)
        self.manual_backward(loss / self.hparams.accum)
        self.clip_gradients(opt, gradient_clip_val=self.hparams.clip, gradient_clip_algorithm="norm")
        if (batch_idx + 1) % self.hparams.accum == 0:
            opt.step()
            opt.zero_grad()
        return loss.detach()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=0.9)


def make_loader(n=192, seq=12, vocab=40, bs=6, seed=3):
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, vocab, (n, seq), generator=g)
    labels = (tokens[:, :4].sum(-1) % 3)
    return DataLoader(TensorDataset(tokens, labels), batch_size=bs, shuffle=False)


def main():
    pl.seed_everything(11, workers=True)
    model = ConvTagger()
    trainer = pl.Trainer(
        accelerator="cpu", devices=2, strategy="ddp", max_epochs=2,
        logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, deterministic=True,
    )
    trainer.fit(model, make_loader())
    if trainer.is_global_zero:
        h = hashlib.sha256()
        for _, p in model.named_parameters():
            h.update(p.detach().to(torch.float32).contiguous().cpu().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}")


if __name__ == "__main__":
    main()
