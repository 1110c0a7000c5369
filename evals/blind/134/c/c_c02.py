"""Sequence tagger in PyTorch Lightning, 2 CPU DDP ranks, accumulate_grad_batches=3.

Pretrained-style frozen embedding table, GRU encoder and tagging head in two
parameter groups, norm clipping that acts, cosine schedule sized by
`estimated_stepping_batches`, a DataLoader worker process.
"""
import hashlib

import pytorch_lightning as pl
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

VOCAB, TAGS, SEQ = 64, 7, 12
HPARAMS = dict(batch_size=4, accumulate=3, epochs=2, n_seqs=288, lr_encoder=2e-3,
               lr_head=6e-3, clip=0.05, seed=99)


class TagDataset(Dataset):
    def __init__(self, n):
        g = torch.Generator().manual_seed(3)
        self.tokens = torch.randint(VOCAB, (n, SEQ), generator=g)
        table = torch.randint(TAGS, (VOCAB,), generator=g)
        self.tags = (table[self.tokens] + torch.roll(self.tokens, 1, 1) % 2) % TAGS

    def __len__(self):
        return len(self.tokens)

    def __getitem__(self, i):
        return self.tokens[i], self.tags[i]


class Tagger(pl.LightningModule):
    def __init__(self, hp):
        super().__init__()
        self.hp = hp
        self.embed = nn.Embedding(VOCAB, 24)
        self.embed.weight.requires_grad_(False)
        self.encoder = nn.GRU(24, 32, batch_first=True, bidirectional=True)
        self.head = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, TAGS))

    def forward(self, tokens):
        h, _ = self.encoder(self.embed(tokens))
        return self.head(h)

    def training_step(self, batch, batch_idx):
        tokens, tags = batch
        logits = self(tokens)
        return F.cross_entropy(logits.reshape(-1, TAGS), tags.reshape(-1))

    def configure_optimizers(self):
        opt = torch.optim.AdamW([
            {"params": self.encoder.parameters(), "lr": self.hp["lr_encoder"]},
            {"params": self.head.parameters(), "lr": self.hp["lr_head"], "weight_decay": 0.0},
        ], weight_decay=0.05)
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(
            opt, T_max=self.trainer.estimated_stepping_batches)
        return [opt], [{"scheduler": sched, "interval": "step"}]

    def train_dataloader(self):
        return DataLoader(TagDataset(self.hp["n_seqs"]), batch_size=self.hp["batch_size"],
                          shuffle=True, num_workers=1, persistent_workers=True)


class NormProbe(pl.Callback):
    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        if trainer.global_step == 0 and trainer.global_rank == 0:
            norm = torch.norm(torch.stack([p.grad.norm() for p in pl_module.parameters()
                                           if p.grad is not None]))
            print(f"pre-clip grad norm at step 0: {norm:.3f} (clip {pl_module.hp['clip']})")


def main():
    hp = HPARAMS
    pl.seed_everything(hp["seed"], workers=True)
    model = Tagger(hp)
    trainer = pl.Trainer(
        accelerator="cpu", devices=2, strategy="ddp", max_epochs=hp["epochs"],
        accumulate_grad_batches=hp["accumulate"], gradient_clip_val=hp["clip"],
        gradient_clip_algorithm="norm", deterministic=True, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        callbacks=[NormProbe()],
    )
    trainer.fit(model)
    assert trainer.world_size == 2
    h = hashlib.sha256()
    for _, p in model.named_parameters():
        h.update(p.detach().float().contiguous().cpu().numpy().tobytes())
    if trainer.global_rank == 0:
        print(f"global_step {trainer.global_step}")
        print(f"FINAL_SHA256 {h.hexdigest()}")


if __name__ == "__main__":
    main()
