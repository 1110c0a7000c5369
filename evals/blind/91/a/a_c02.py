"""Lightning classifier with a frozen pretrained-style embedding table, accumulation of
2 micro-batches, a gradient clip, and a run split in two: the first Trainer stops after
one epoch and saves a checkpoint, a fresh Trainer and module resume from it.
"""
import hashlib
import os
import tempfile

import torch
import torch.nn as nn
import pytorch_lightning as pl
from pytorch_lightning.strategies import DDPStrategy
from torch.utils.data import DataLoader, TensorDataset

SEED = 21
ACCUM = 2
CLIP = 0.1


class BagClassifier(pl.LightningModule):
    def __init__(self, vocab=50, dim=16, n_cls=4, lr=0.05):
        super().__init__()
        self.save_hyperparameters()
        g = torch.Generator().manual_seed(99)
        self.emb = nn.Embedding(vocab, dim)
        with torch.no_grad():
            self.emb.weight.copy_(torch.randn(vocab, dim, generator=g))
        self.emb.weight.requires_grad_(False)
        self.proj = nn.Linear(dim, dim)
        self.out = nn.Linear(dim, n_cls)

    def forward(self, tokens):
        h = self.emb(tokens).mean(dim=1)
        return self.out(torch.relu(self.proj(h)))

    def training_step(self, batch, batch_idx):
        tokens, labels = batch
        return nn.functional.cross_entropy(self(tokens), labels)

    def configure_optimizers(self):
        params = [p for p in self.parameters() if p.requires_grad]
        opt = torch.optim.SGD(params, lr=self.hparams.lr, momentum=0.9)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.7)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def loader():
    g = torch.Generator().manual_seed(SEED)
    tokens = torch.randint(0, 50, (64, 6), generator=g)
    labels = (tokens[:, 0] + tokens[:, 1]) % 4
    return DataLoader(TensorDataset(tokens, labels), batch_size=4, shuffle=False)


def make_trainer(max_epochs):
    return pl.Trainer(
        accelerator="cpu", devices=2, strategy=DDPStrategy(process_group_backend="gloo"),
        max_epochs=max_epochs, accumulate_grad_batches=ACCUM,
        gradient_clip_val=CLIP, gradient_clip_algorithm="norm",
        deterministic=True, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False,
    )


def main():
    pl.seed_everything(SEED, workers=True)
    ckpt_dir = os.environ.get("TMPDIR", tempfile.gettempdir())
    ckpt = os.path.join(ckpt_dir, f"a_c02_{os.environ.get('MASTER_PORT', '0')}.ckpt")

    first = make_trainer(max_epochs=1)
    first.fit(BagClassifier(), loader())
    first.save_checkpoint(ckpt)
    first.strategy.barrier()

    model = BagClassifier()
    second = make_trainer(max_epochs=3)
    second.fit(model, loader(), ckpt_path=ckpt)
    assert second.world_size == 2

    if second.is_global_zero:
        h = hashlib.sha256()
        for _, p in model.named_parameters():
            h.update(p.detach().to(torch.float32).contiguous().cpu().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}")
        os.remove(ckpt)


if __name__ == "__main__":
    main()
