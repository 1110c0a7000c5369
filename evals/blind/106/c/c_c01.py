"""Distillation with Lightning, interrupted after two epochs and resumed by a new Trainer.

Student embedding is frozen (copied from the teacher's first d columns), two AdamW
groups (decay / no decay), gradient clipping at 0.5, a per-step warm-up + cosine
schedule sized by hand, and a resume from a checkpoint into a rebuilt module.
"""
import hashlib
import math
import os
import tempfile

import torch
import torch.nn as nn
import torch.nn.functional as F
import pytorch_lightning as pl
from torch.utils.data import DataLoader, TensorDataset

CFG = dict(vocab=64, seq_len=12, n_classes=8, d_s=32, d_t=64, T=2.0, alpha=0.7,
           lr=3e-3, wd=0.05, warmup=4, micro_batch=8, accum=2, world=2,
           n_samples=256, first_epochs=2, total_epochs=3, clip=0.5, seed=21)


class Encoder(nn.Module):
    def __init__(self, vocab, d, n_classes):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.norm = nn.LayerNorm(d)
        self.ff = nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))
        self.head = nn.Linear(d, n_classes)

    def forward(self, ids):
        h = self.emb(ids)
        h = h + self.ff(self.norm(h))
        return self.head(h.mean(1))


class Student(pl.LightningModule):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        torch.manual_seed(cfg["seed"])
        self.teacher = Encoder(cfg["vocab"], cfg["d_t"], cfg["n_classes"])
        self.student = Encoder(cfg["vocab"], cfg["d_s"], cfg["n_classes"])
        with torch.no_grad():
            self.student.emb.weight.copy_(self.teacher.emb.weight[:, : cfg["d_s"]])
        self.student.emb.weight.requires_grad_(False)
        self.teacher.requires_grad_(False)

    def on_train_epoch_start(self):
        self.teacher.eval()

    def training_step(self, batch, batch_idx):
        ids, y = batch
        with torch.no_grad():
            t = self.teacher(ids)
        s = self.student(ids)
        T = self.cfg["T"]
        kd = F.kl_div(F.log_softmax(s / T, -1), F.log_softmax(t / T, -1), log_target=True,
                      reduction="batchmean") * T * T
        ce = F.cross_entropy(s, y)
        return self.cfg["alpha"] * kd + (1 - self.cfg["alpha"]) * ce

    def configure_optimizers(self):
        c = self.cfg
        decay, no_decay = [], []
        for n, p in self.student.named_parameters():
            if not p.requires_grad:
                continue
            (no_decay if p.ndim < 2 else decay).append(p)
        opt = torch.optim.AdamW([{"params": decay, "weight_decay": c["wd"]},
                                 {"params": no_decay, "weight_decay": 0.0}], lr=c["lr"])
        steps_per_epoch = c["n_samples"] // (c["micro_batch"] * c["world"]) // c["accum"]
        total = steps_per_epoch * c["total_epochs"]

        def lr_lambda(step):
            if step < c["warmup"]:
                return (step + 1) / c["warmup"]
            return 0.5 * (1 + math.cos(math.pi * (step - c["warmup"]) / (total - c["warmup"])))

        sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def make_loader(cfg):
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(0, cfg["vocab"], (cfg["n_samples"], cfg["seq_len"]), generator=g)
    y = (ids[:, 1] * 3 + ids[:, 4]) % cfg["n_classes"]
    return DataLoader(TensorDataset(ids, y), batch_size=cfg["micro_batch"], shuffle=True)


def make_trainer(max_epochs):
    return pl.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=max_epochs,
                      accumulate_grad_batches=CFG["accum"], gradient_clip_val=CFG["clip"],
                      gradient_clip_algorithm="norm", deterministic=True, logger=False,
                      enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)


def params_sha256(module):
    h = hashlib.sha256()
    for _, p in module.named_parameters():
        h.update(p.detach().to(torch.float32).contiguous().cpu().numpy().tobytes())
    return h.hexdigest()


def main():
    ckpt = os.path.join(tempfile.gettempdir(), f"c_c01_{os.environ.get('MASTER_PORT', '0')}.ckpt")
    pl.seed_everything(CFG["seed"], workers=True)
    first = make_trainer(CFG["first_epochs"])
    first.fit(Student(CFG), make_loader(CFG))
    first.save_checkpoint(ckpt)
    first.strategy.barrier()

    # "preempted": rebuild everything and resume from the checkpoint
    pl.seed_everything(CFG["seed"], workers=True)
    model = Student(CFG)
    second = make_trainer(CFG["total_epochs"])
    second.fit(model, make_loader(CFG), ckpt_path=ckpt)
    if second.is_global_zero:
        print(f"FINAL_SHA256 {params_sha256(model)}")
        os.remove(ckpt)


if __name__ == "__main__":
    main()
