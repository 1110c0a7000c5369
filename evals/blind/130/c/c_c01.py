"""Lightning DDP text classifier, K = 3, frozen embedding table, two param groups,
an L2 pull toward the initial weights (L2-SP) added to the gradient once per
optimizer step in on_before_optimizer_step, and norm clipping at 0.3.
"""
import hashlib
import os

import torch
import torch.nn as nn
import torch.nn.functional as F
import pytorch_lightning as pl
from torch.utils.data import DataLoader, TensorDataset

K = 3
L2SP = 0.02


def make_data(n=72, seq=10, vocab=50, n_cls=3, seed=11):
    g = torch.Generator().manual_seed(seed)
    toks = torch.randint(0, vocab, (n, seq), generator=g)
    y = (toks[:, :3].sum(1) % n_cls)
    return TensorDataset(toks, y)


class BagClassifier(pl.LightningModule):
    def __init__(self, vocab=50, dim=24, n_cls=3):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.emb.weight.requires_grad_(False)  # pretrained table, kept fixed
        self.enc = nn.Sequential(nn.Linear(dim, 48), nn.Tanh(), nn.Linear(48, 48), nn.Tanh())
        self.cls = nn.Linear(48, n_cls)
        self.anchor = {n: p.detach().clone() for n, p in self.enc.named_parameters()}

    def forward(self, toks):
        return self.cls(self.enc(self.emb(toks).mean(1)))

    def training_step(self, batch, batch_idx):
        toks, y = batch
        return F.cross_entropy(self(toks), y)

    def on_before_optimizer_step(self, optimizer):
        # runs once per optimizer step, after the whole window's backward and sync
        for n, p in self.enc.named_parameters():
            p.grad.add_(p.detach() - self.anchor[n].to(p.device), alpha=L2SP)

    def configure_optimizers(self):
        groups = [
            {"params": self.enc.parameters(), "lr": 2e-3},
            {"params": self.cls.parameters(), "lr": 5e-3},
        ]
        return torch.optim.Adam(groups)


def params_sha(module):
    h = hashlib.sha256()
    for _, p in module.named_parameters():
        h.update(p.detach().cpu().float().contiguous().numpy().tobytes())
    return h.hexdigest()


def main():
    pl.seed_everything(99, workers=True)
    model = BagClassifier()
    loader = DataLoader(make_data(), batch_size=4)
    trainer = pl.Trainer(
        accelerator="cpu", devices=2, strategy="ddp", max_epochs=3,
        accumulate_grad_batches=K, gradient_clip_val=0.3, gradient_clip_algorithm="norm",
        logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, deterministic=True,
    )
    trainer.fit(model, loader)
    if trainer.global_rank == 0:
        if os.environ.get("PARAM_DUMP"):
            torch.save({n: p.detach().clone() for n, p in model.named_parameters()}, os.environ["PARAM_DUMP"])
        print("FINAL_SHA256", params_sha(model), flush=True)


if __name__ == "__main__":
    main()
