"""Lightning DDP fine-tune of a small sequence tagger with a frozen embedding.

bf16 autocast, two parameter groups (encoder / head), norm clipping, a warm-up
+ cosine schedule stepped per optimizer step, worker processes in the loader.
Launched with torchrun.
"""
import hashlib
import math
from dataclasses import dataclass, asdict

import torch
import torch.nn as nn
import torch.nn.functional as F
import pytorch_lightning as pl
from torch.utils.data import DataLoader, Dataset


@dataclass
class HParams:
    vocab: int = 64
    d_model: int = 48
    n_tags: int = 7
    seq_len: int = 16
    batch_size: int = 6
    accumulate: int = 3
    epochs: int = 2
    batches_per_rank: int = 12
    lr_encoder: float = 2e-3
    lr_head: float = 6e-3
    clip: float = 0.05
    warmup: int = 2
    seed: int = 2024


class TagData(Dataset):
    def __init__(self, n, hp: HParams):
        g = torch.Generator().manual_seed(hp.seed)
        self.tokens = torch.randint(0, hp.vocab, (n, hp.seq_len), generator=g)
        self.tags = (self.tokens * 3 + torch.roll(self.tokens, 1, 1)) % hp.n_tags

    def __len__(self):
        return len(self.tokens)

    def __getitem__(self, i):
        return self.tokens[i], self.tags[i]


class Tagger(pl.LightningModule):
    def __init__(self, **hp):
        super().__init__()
        self.save_hyperparameters()
        h = self.hparams
        self.embed = nn.Embedding(h.vocab, h.d_model)
        self.embed.weight.requires_grad_(False)           # frozen, pretrained in real life
        self.encoder = nn.GRU(h.d_model, h.d_model, batch_first=True, bidirectional=True)
        self.head = nn.Sequential(nn.Linear(2 * h.d_model, h.d_model), nn.ReLU(),
                                  nn.Linear(h.d_model, h.n_tags))

    def forward(self, tokens):
        out, _ = self.encoder(self.embed(tokens))
        return self.head(out)

    def training_step(self, batch, batch_idx):
        tokens, tags = batch
        logits = self(tokens)
        loss = F.cross_entropy(logits.float().flatten(0, 1), tags.flatten())
        self.log("loss", loss, prog_bar=False)
        return loss

    def configure_optimizers(self):
        h = self.hparams
        opt = torch.optim.AdamW([
            {"params": self.encoder.parameters(), "lr": h.lr_encoder, "weight_decay": 0.01},
            {"params": self.head.parameters(), "lr": h.lr_head, "weight_decay": 0.0},
        ])
        total = self.trainer.estimated_stepping_batches

        def lr_lambda(step):
            if step < h.warmup:
                return (step + 1) / h.warmup
            return 0.5 * (1 + math.cos(math.pi * (step - h.warmup) / max(1, total - h.warmup)))

        sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def params_sha256(module):
    h = hashlib.sha256()
    for _, p in module.named_parameters():
        h.update(p.detach().float().contiguous().numpy().tobytes())
    return h.hexdigest()


def main():
    hp = HParams()
    pl.seed_everything(hp.seed, workers=True)
    world = 2
    data = TagData(world * hp.batches_per_rank * hp.batch_size, hp)
    loader = DataLoader(data, batch_size=hp.batch_size, shuffle=True, num_workers=1,
                        persistent_workers=True)
    model = Tagger(**asdict(hp))
    trainer = pl.Trainer(
        accelerator="cpu", devices=world, strategy="ddp",
        precision="bf16-mixed",
        max_epochs=hp.epochs,
        accumulate_grad_batches=hp.accumulate,
        gradient_clip_val=hp.clip, gradient_clip_algorithm="norm",
        deterministic=True, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False,
    )
    trainer.fit(model, train_dataloaders=loader)
    if trainer.is_global_zero:
        print(f"FINAL_SHA256 {params_sha256(model)}", flush=True)


if __name__ == "__main__":
    main()
