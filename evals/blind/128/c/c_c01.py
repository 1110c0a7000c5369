"""Lightning DDP sentence tagger with a frozen (pre-trained style) embedding
table, two parameter groups, a per-step warm-up/decay schedule, gradient
clipping and a DataLoader worker. Accumulation is left to the Trainer.
"""
import hashlib
import warnings

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset
import pytorch_lightning as pl

warnings.filterwarnings("ignore")

HP = dict(vocab=120, dim=24, hidden=48, classes=6, seq=10, rows=108, micro=6,
          accum=3, epochs=4, lr=2e-3, head_lr=5e-3, wd=0.05, clip=0.08, warmup=2, seed=2024)


class ClipCounter(pl.Callback):
    """Counts updates where the pre-clip norm exceeds the clip value."""

    def __init__(self, clip):
        self.clip, self.acted, self.steps = clip, 0, 0

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        grads = [p.grad for p in pl_module.parameters() if p.grad is not None]
        norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))
        self.steps += 1
        self.acted += int(norm > self.clip)
        self.max_norm = max(getattr(self, "max_norm", 0.0), float(norm))


class Tagger(pl.LightningModule):
    def __init__(self, **hp):
        super().__init__()
        self.save_hyperparameters()
        h = self.hparams
        self.embed = nn.Embedding(h.vocab, h.dim)
        self.embed.weight.requires_grad_(False)          # frozen table
        self.encoder = nn.GRU(h.dim, h.hidden, batch_first=True)
        self.head = nn.Linear(h.hidden, h.classes)

    def forward(self, x):
        out, _ = self.encoder(self.embed(x))
        return self.head(out)

    def training_step(self, batch, batch_idx):
        x, y = batch
        logits = self(x)
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1))

    def configure_optimizers(self):
        h = self.hparams
        opt = torch.optim.AdamW(
            [
                {"params": self.encoder.parameters(), "lr": h.lr, "weight_decay": h.wd},
                {"params": self.head.parameters(), "lr": h.head_lr, "weight_decay": 0.0},
            ]
        )
        total = self.trainer.estimated_stepping_batches

        def lr_lambda(step):
            if step < h.warmup:
                return (step + 1) / h.warmup
            return max(0.1, (total - step) / max(1, total - h.warmup))

        sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def main():
    pl.seed_everything(HP["seed"], workers=True)
    torch.use_deterministic_algorithms(True)
    g = torch.Generator().manual_seed(HP["seed"])
    x = torch.randint(0, HP["vocab"], (HP["rows"], HP["seq"]), generator=g)
    y = (x * 7 + torch.roll(x, 1, dims=1)) % HP["classes"]
    loader = DataLoader(TensorDataset(x, y), batch_size=HP["micro"], shuffle=False, num_workers=1)

    model = Tagger(**HP)
    clip_cb = ClipCounter(HP["clip"])
    trainer = pl.Trainer(
        accelerator="cpu", devices=2, strategy="ddp",
        max_epochs=HP["epochs"], accumulate_grad_batches=HP["accum"],
        gradient_clip_val=HP["clip"], gradient_clip_algorithm="norm",
        callbacks=[clip_cb], deterministic=True, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
    )
    trainer.fit(model, loader)
    if trainer.global_rank == 0:
        print(f"optimizer steps {trainer.global_step}, clip acted on {clip_cb.acted}/{clip_cb.steps} (max pre-clip norm {clip_cb.max_norm:.3f})")
        h = hashlib.sha256()
        for _, p in model.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)


if __name__ == "__main__":
    main()
