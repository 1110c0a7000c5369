"""Sequence tagger in Lightning (DDP x 2), K = 3, stopped after one epoch and resumed.

- `accumulate_grad_batches=3` with 9 micro-batches per rank per epoch (no short tail);
- frozen pretrained-style embedding table (requires_grad=False, outside the optimizer);
- two AdamW groups, a per-step warm-up/linear-decay LambdaLR sized from
  `estimated_stepping_batches`, and a norm clip (applied by Lightning once per step);
- a DataLoader with one worker process;
- the first Trainer stops after epoch 0; a brand-new model and Trainer resume from
  the checkpoint and finish the remaining epochs.
"""
import hashlib
import os
import tempfile

import torch
import torch.nn as nn
import torch.nn.functional as F
import pytorch_lightning as pl
from torch.utils.data import DataLoader, Subset, TensorDataset

SEED, VOCAB, TAGS, SEQ, EMB, HID = 5, 60, 9, 12, 24, 32
MICRO, ACCUM, EPOCHS, LR, CLIP = 4, 3, 3, 4e-3, 0.25


class Tagger(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, EMB)
        self.emb.weight.requires_grad_(False)  # frozen table
        self.rnn = nn.GRU(EMB, HID, batch_first=True, bidirectional=True)
        self.out = nn.Linear(2 * HID, TAGS)

    def forward(self, tokens):
        h, _ = self.rnn(self.emb(tokens))
        return self.out(h)

    def training_step(self, batch, batch_idx):
        tokens, tags = batch
        logits = self(tokens)
        return F.cross_entropy(logits.reshape(-1, TAGS), tags.reshape(-1))  # equal token counts

    def configure_optimizers(self):
        decay = [p for n, p in self.named_parameters() if p.requires_grad and p.dim() >= 2]
        other = [p for n, p in self.named_parameters() if p.requires_grad and p.dim() < 2]
        opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.05}, {"params": other, "weight_decay": 0.0}], lr=LR)
        total, warm = self.trainer.estimated_stepping_batches, 2

        def lr_lambda(step):
            return (step + 1) / warm if step < warm else max(0.05, (total - step) / max(1, total - warm))

        return {"optimizer": opt, "lr_scheduler": {"scheduler": torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda), "interval": "step"}}


class StopAfterFirstEpoch(pl.Callback):
    def on_train_epoch_end(self, trainer, pl_module):
        trainer.should_stop = True


def dataset():
    g = torch.Generator().manual_seed(SEED)
    n = 2 * MICRO * 9  # 9 micro-batches per rank per epoch
    tokens = torch.randint(0, VOCAB, (n, SEQ), generator=g)
    tags = (tokens * 7 + torch.roll(tokens, 1, dims=1)) % TAGS
    return TensorDataset(tokens, tags)


def make_trainer(callbacks=()):
    return pl.Trainer(
        accelerator="cpu", devices=2, strategy="ddp", max_epochs=EPOCHS,
        accumulate_grad_batches=ACCUM, use_distributed_sampler=False, gradient_clip_val=CLIP, gradient_clip_algorithm="norm",
        callbacks=list(callbacks), logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, deterministic=True,
    )


def loader():
    # each rank reads its own interleaved shard in a fixed order (no re-shuffling on resume)
    ds, rank = dataset(), int(os.environ.get("RANK", 0))
    return DataLoader(Subset(ds, list(range(rank, len(ds), 2))), batch_size=MICRO, num_workers=1)


def main():
    ckpt_dir = os.environ.get("TMPDIR", tempfile.gettempdir())
    ckpt = os.path.join(ckpt_dir, f"c_c03_{os.environ.get('MASTER_PORT', 'x')}.ckpt")

    pl.seed_everything(SEED, workers=True)
    first = make_trainer([StopAfterFirstEpoch()])
    first.fit(Tagger(), train_dataloaders=loader())
    first.save_checkpoint(ckpt)

    pl.seed_everything(SEED, workers=True)  # same data-order seed; weights come from the checkpoint
    model = Tagger()
    second = make_trainer()
    second.fit(model, train_dataloaders=loader(), ckpt_path=ckpt)
    if second.global_rank == 0:
        flat = torch.cat([p.detach().float().reshape(-1).cpu() for _, p in model.named_parameters()])
        print(f"FINAL_SHA256 {hashlib.sha256(flat.numpy().tobytes()).hexdigest()}", flush=True)
        os.remove(ckpt)


if __name__ == "__main__":
    main()
