"""Knowledge distillation of a small token classifier with PyTorch Lightning.

Student learns from (a) hard labels, (b) the frozen teacher's softened logits and
(c) a feature hint on the pooled hidden state.  Linear LR warm-up is done in an
``optimizer_step`` override, as in the Lightning docs.
"""
import hashlib
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
import pytorch_lightning as pl
from torch.utils.data import DataLoader, TensorDataset


@dataclass
class DistillConfig:
    vocab: int = 64
    seq_len: int = 12
    n_classes: int = 8
    d_student: int = 32
    d_teacher: int = 64
    temperature: float = 2.0
    alpha_kd: float = 0.5
    beta_hint: float = 0.1
    lr: float = 3e-3
    warmup_steps: int = 10
    micro_batch: int = 8
    grad_accum: int = 2
    epochs: int = 3
    n_samples: int = 256


class Encoder(nn.Module):
    def __init__(self, vocab, d, n_classes):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.mix = nn.Sequential(nn.Linear(d, d), nn.GELU(), nn.Linear(d, d))
        self.head = nn.Linear(d, n_classes)

    def forward(self, ids):
        h = self.emb(ids)
        h = h + self.mix(h)
        pooled = h.mean(dim=1)
        return self.head(pooled), pooled


def distill_losses(s_logits, t_logits, s_feat, t_feat, labels, cfg):
    ce = F.cross_entropy(s_logits, labels)
    T = cfg.temperature
    kd = F.kl_div(F.log_softmax(s_logits / T, -1), F.softmax(t_logits / T, -1),
                  reduction="batchmean") * T * T
    hint = F.mse_loss(s_feat, t_feat)
    return ce, kd, hint


class DistillModule(pl.LightningModule):
    def __init__(self, cfg: DistillConfig):
        super().__init__()
        self.cfg = cfg
        self.student = Encoder(cfg.vocab, cfg.d_student, cfg.n_classes)
        self.hint_proj = nn.Linear(cfg.d_student, cfg.d_teacher)
        self.teacher = Encoder(cfg.vocab, cfg.d_teacher, cfg.n_classes)
        self.teacher.requires_grad_(False)
        self.teacher.eval()

    def training_step(self, batch, batch_idx):
        ids, labels = batch
        with torch.no_grad():
            t_logits, t_feat = self.teacher(ids)
        s_logits, s_feat = self.student(ids)
        ce, kd, hint = distill_losses(s_logits, t_logits, self.hint_proj(s_feat), t_feat, labels, self.cfg)
        return (1 - self.cfg.alpha_kd) * ce + self.cfg.alpha_kd * kd + self.cfg.beta_hint * hint

    def configure_optimizers(self):
        params = [p for p in self.parameters() if p.requires_grad]
        return torch.optim.AdamW(params, lr=self.cfg.lr, weight_decay=0.01)

    def optimizer_step(self, epoch, batch_idx, optimizer, optimizer_closure=None):
        # linear warm-up
        lr_scale = min(1.0, float(self.trainer.global_step + 1) / self.cfg.warmup_steps)
        for pg in optimizer.param_groups:
            pg["lr"] = lr_scale * self.cfg.lr
        optimizer.step(closure=optimizer_closure)


def make_data(cfg):
    g = torch.Generator().manual_seed(1234)
    ids = torch.randint(0, cfg.vocab, (cfg.n_samples, cfg.seq_len), generator=g)
    labels = (ids[:, 0] + ids[:, -1]) % cfg.n_classes
    return TensorDataset(ids, labels)


def params_sha256(module):
    h = hashlib.sha256()
    for _, p in module.named_parameters():
        h.update(p.detach().to(torch.float32).contiguous().cpu().numpy().tobytes())
    return h.hexdigest()


def main():
    cfg = DistillConfig()
    pl.seed_everything(0, workers=True)
    model = DistillModule(cfg)
    loader = DataLoader(make_data(cfg), batch_size=cfg.micro_batch, shuffle=True)
    trainer = pl.Trainer(
        accelerator="cpu", devices=2, num_nodes=1, strategy="ddp",
        max_epochs=cfg.epochs, accumulate_grad_batches=cfg.grad_accum,
        deterministic=True, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False,
    )
    trainer.fit(model, loader)
    if trainer.global_rank == 0:
        print(f"FINAL_SHA256 {params_sha256(model)}")


if __name__ == "__main__":
    main()
