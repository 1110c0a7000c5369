"""Sequence classifier with Lightning automatic optimisation and accumulate_grad_batches=3.

Unusual but legal pieces: a frozen sinusoid-like positional table, bf16-mixed autocast
over fp32 weights, a DataLoader with a worker process, two AdamW groups, and a
``configure_gradient_clipping`` override that clips only the classifier group (Lightning
calls it once per optimizer step, after the window is complete).  A callback records the
gradient norm right before each step.
"""
import hashlib
import math

import pytorch_lightning as pl
import torch
import torch.nn as nn
import torch.nn.functional as F
from pytorch_lightning.strategies import DDPStrategy
from torch.utils.data import DataLoader, TensorDataset

K = 3
VOCAB, DIM, SEQ, CLASSES = 64, 32, 12, 4


class SeqClassifier(pl.LightningModule):
    def __init__(self, lr=3e-3, head_lr=1e-2, head_clip=0.25):
        super().__init__()
        self.save_hyperparameters()
        self.tok = nn.Embedding(VOCAB, DIM)
        pos = torch.arange(SEQ).unsqueeze(1) * torch.exp(-math.log(100.0) * torch.arange(DIM) / DIM)
        self.pos = nn.Parameter(torch.sin(pos), requires_grad=False)
        self.mix = nn.Sequential(nn.Linear(DIM, 2 * DIM), nn.GELU(), nn.Linear(2 * DIM, DIM))
        self.classifier = nn.Linear(DIM, CLASSES)

    def forward(self, ids):
        h = self.tok(ids) + self.pos
        h = h + self.mix(h)
        return self.classifier(h.mean(1))

    def training_step(self, batch, batch_idx):
        ids, y = batch
        logits = self(ids)
        loss = F.cross_entropy(logits.float(), y)
        self.log("loss", loss, prog_bar=False)
        return loss

    def configure_optimizers(self):
        opt = torch.optim.AdamW(
            [
                {"params": list(self.tok.parameters()) + list(self.mix.parameters()), "weight_decay": 0.01},
                {"params": self.classifier.parameters(), "lr": self.hparams.head_lr, "weight_decay": 0.0},
            ],
            lr=self.hparams.lr,
        )
        total = self.trainer.estimated_stepping_batches
        sched = torch.optim.lr_scheduler.LinearLR(opt, start_factor=1.0, end_factor=0.2, total_iters=total)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    def configure_gradient_clipping(self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None):
        torch.nn.utils.clip_grad_norm_(optimizer.param_groups[1]["params"], self.hparams.head_clip)


class GradNormProbe(pl.Callback):
    def __init__(self):
        self.norms = []

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        grads = [p.grad for p in pl_module.parameters() if p.grad is not None]
        self.norms.append(torch.linalg.vector_norm(torch.stack([g.norm() for g in grads])).item())


def make_data():
    g = torch.Generator().manual_seed(8)
    ids = torch.randint(0, VOCAB, (216, SEQ), generator=g)   # 216 / (2 ranks * 12) = 9 micro-batches per rank
    y = ((ids[:, :4].sum(1) + ids[:, -1]) % CLASSES)
    return TensorDataset(ids, y)


def main():
    pl.seed_everything(31, workers=True)
    model = SeqClassifier()
    loader = DataLoader(make_data(), batch_size=12, shuffle=True, num_workers=1, persistent_workers=False)
    probe = GradNormProbe()
    trainer = pl.Trainer(
        accelerator="cpu", devices=2, strategy=DDPStrategy(process_group_backend="gloo"),
        precision="bf16-mixed", accumulate_grad_batches=K, max_epochs=2, deterministic=True,
        logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        callbacks=[probe],
    )
    trainer.fit(model, loader)
    if trainer.global_rank == 0:
        h = hashlib.sha256()
        for _, p in model.named_parameters():
            h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
        print(f"steps {trainer.global_step} grad norms {[round(n, 3) for n in probe.norms]}")
        print(f"FINAL_SHA256 {h.hexdigest()}")


if __name__ == "__main__":
    main()
