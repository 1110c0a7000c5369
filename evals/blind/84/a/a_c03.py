"""Lightning Trainer (automatic optimisation), DDP on 2 CPU ranks under torchrun.

accumulate_grad_batches=4, gradient clipping by norm, a frozen (non-trainable)
positional table, and a OneCycle schedule stepped per optimizer step whose length
comes from trainer.estimated_stepping_batches.
"""
import hashlib, os

import torch
import torch.nn as nn
import torch.nn.functional as F
import pytorch_lightning as pl
from torch.utils.data import DataLoader, TensorDataset

HP = dict(vocab=40, dim=16, seq=8, classes=3, micro_bs=3, accum=4, epochs=2,
          n_per_rank=36, max_lr=5e-3, clip=0.5, seed=123)


class SeqTagger(pl.LightningModule):
    def __init__(self, hp):
        super().__init__()
        self.hp = hp
        self.tok = nn.Embedding(hp["vocab"], hp["dim"])
        self.pos = nn.Parameter(torch.randn(hp["seq"], hp["dim"]) * 0.1, requires_grad=False)
        self.mix = nn.Linear(hp["dim"], hp["dim"])
        self.out = nn.Linear(hp["dim"], hp["classes"])

    def forward(self, ids):
        h = torch.relu(self.mix(self.tok(ids) + self.pos))
        return self.out(h.max(1).values)

    def training_step(self, batch, batch_idx):
        ids, y = batch
        return F.cross_entropy(self(ids), y)

    def configure_optimizers(self):
        opt = torch.optim.AdamW([p for p in self.parameters() if p.requires_grad], lr=self.hp["max_lr"])
        sched = torch.optim.lr_scheduler.OneCycleLR(
            opt, max_lr=self.hp["max_lr"], total_steps=int(self.trainer.estimated_stepping_batches),
            pct_start=0.3, anneal_strategy="linear")
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step", "frequency": 1}}


def param_sha(module):
    h = hashlib.sha256()
    for _, p in module.named_parameters():
        h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
    if os.environ.get("PARAM_DUMP"):
        torch.save([p.detach().float().cpu() for _, p in module.named_parameters()], os.environ["PARAM_DUMP"])
    return h.hexdigest()


def main():
    pl.seed_everything(HP["seed"], workers=True)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    g = torch.Generator().manual_seed(HP["seed"])
    n = HP["n_per_rank"] * world
    ids = torch.randint(0, HP["vocab"], (n, HP["seq"]), generator=g)
    y = (ids[:, 1] * 7 + ids[:, 5]) % HP["classes"]
    loader = DataLoader(TensorDataset(ids, y), batch_size=HP["micro_bs"], shuffle=False)
    model = SeqTagger(HP)
    trainer = pl.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=HP["epochs"],
                         accumulate_grad_batches=HP["accum"], gradient_clip_val=HP["clip"],
                         gradient_clip_algorithm="norm", logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, deterministic=True)
    trainer.fit(model, loader)
    if trainer.global_rank == 0:
        print("FINAL_SHA256", param_sha(model))


if __name__ == "__main__":
    main()
