"""Bag-of-tokens classifier with Lightning, K = 3 over 7-batch epochs.

Every epoch ends in a one-batch window.  Lightning divides each returned loss by
`accumulate_grad_batches` and still steps on the epoch's last batch, so the
training step rescales by K / (batches in this window): every window is the mean
over its own micro-batches.  The token embedding is frozen; the clip acts.
"""
import hashlib

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset
import pytorch_lightning as pl

VOCAB, SEQ, CLASSES = 50, 12, 4
ROWS_PER_BATCH, BATCHES_PER_RANK = 6, 7


class BagClassifier(pl.LightningModule):
    def __init__(self, lr=0.05, dim=32):
        super().__init__()
        self.save_hyperparameters()
        self.embed = nn.Embedding(VOCAB, dim)
        self.embed.weight.requires_grad_(False)          # frozen, pretrained lookup table
        self.body = nn.Sequential(nn.Linear(dim, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU())
        self.head = nn.Linear(64, CLASSES)

    def forward(self, tokens):
        return self.head(self.body(self.embed(tokens).mean(1)))

    def _window_len(self, batch_idx):
        k = self.trainer.accumulate_grad_batches
        n = self.trainer.num_training_batches
        start = (batch_idx // k) * k
        return min(k, n - start)

    def training_step(self, batch, batch_idx):
        tokens, y = batch
        loss = F.cross_entropy(self(tokens), y)
        k = self.trainer.accumulate_grad_batches
        return loss * k / self._window_len(batch_idx)

    def configure_optimizers(self):
        params = [p for p in self.parameters() if p.requires_grad]
        return torch.optim.SGD(params, lr=self.hparams.lr, momentum=0.9)


def dataset(seed=11):
    g = torch.Generator().manual_seed(seed)
    n = 2 * ROWS_PER_BATCH * BATCHES_PER_RANK
    tokens = torch.randint(0, VOCAB, (n, SEQ), generator=g)
    y = (tokens[:, :3].sum(1) + tokens[:, -1]) % CLASSES
    return TensorDataset(tokens, y)


def main():
    pl.seed_everything(99, workers=True)
    model = BagClassifier()
    loader = DataLoader(dataset(), batch_size=ROWS_PER_BATCH, shuffle=False)
    trainer = pl.Trainer(
        accelerator="cpu", devices=2, strategy="ddp",
        max_epochs=4, accumulate_grad_batches=3,
        gradient_clip_val=0.25, gradient_clip_algorithm="norm",
        logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, deterministic=True,
    )
    trainer.fit(model, loader)
    if trainer.global_rank == 0:
        print(f"optimizer steps: {trainer.global_step}", flush=True)
        h = hashlib.sha256()
        for _, p in model.named_parameters():
            h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)


if __name__ == "__main__":
    main()
