"""Lightning manual optimisation: a sequence tagger with a frozen positional table, two AdamW
parameter groups, gradient accumulation of K micro-batches whose DDP all-reduce is deferred to
the window's last micro-batch with `toggle_model(sync_grad=...)`, a short last window at the
end of each epoch (3-3-2), a norm clip at each step and a per-step warm-up/decay schedule."""
import hashlib
import math
from dataclasses import dataclass, asdict

import torch
import torch.nn as nn
import torch.nn.functional as F
import pytorch_lightning as pl


@dataclass
class HParams:
    seed: int = 5
    vocab: int = 40
    tags: int = 6
    seq: int = 12
    dim: int = 32
    micro_batch: int = 6
    accumulate: int = 3
    batches_per_rank: int = 8       # windows of 3, 3, 2 per epoch
    epochs: int = 3
    lr_body: float = 3e-3
    lr_head: float = 1e-2
    clip: float = 0.5


class Tagger(pl.LightningModule):
    def __init__(self, hp: HParams):
        super().__init__()
        self.save_hyperparameters(asdict(hp))
        self.hp = hp
        self.automatic_optimization = False
        self.tok = nn.Embedding(hp.vocab, hp.dim)
        self.pos = nn.Parameter(torch.randn(hp.seq, hp.dim) * 0.1, requires_grad=False)
        self.mix = nn.GRU(hp.dim, hp.dim, batch_first=True)
        self.head = nn.Linear(hp.dim, hp.tags)

    def forward(self, x):
        h, _ = self.mix(self.tok(x) + self.pos)
        return self.head(h)

    def _window(self, batch_idx):
        n, K = self.trainer.num_training_batches, self.hp.accumulate
        start = (batch_idx // K) * K
        size = min(K, n - start)
        return size, batch_idx == start + size - 1

    def training_step(self, batch, batch_idx):
        x, y, valid = batch
        opt = self.optimizers()
        sched = self.lr_schedulers()
        size, last = self._window(batch_idx)
        with opt.toggle_model(sync_grad=last):
            logits = self(x)
            tok_loss = F.cross_entropy(logits.transpose(1, 2), y, reduction="none")
            # each micro-batch has the same number of tokens: mean over the window = mean / size
            loss = (tok_loss * valid).sum() / valid.sum().clamp(min=1) / size
            self.manual_backward(loss)
        if last:
            self.clip_gradients(opt, gradient_clip_val=self.hp.clip, gradient_clip_algorithm="norm")
            opt.step()
            opt.zero_grad(set_to_none=True)
            sched.step()
        self.log("ce", loss.detach() * size)

    def configure_optimizers(self):
        body = [p for n, p in self.named_parameters() if p.requires_grad and not n.startswith("head")]
        opt = torch.optim.AdamW([
            {"params": body, "lr": self.hp.lr_body, "weight_decay": 0.01},
            {"params": self.head.parameters(), "lr": self.hp.lr_head, "weight_decay": 0.0},
        ])
        steps = self.hp.epochs * math.ceil(self.hp.batches_per_rank / self.hp.accumulate)
        warm = 2
        lam = lambda s: (s + 1) / warm if s < warm else max(0.1, (steps - s) / (steps - warm))
        return [opt], [torch.optim.lr_scheduler.LambdaLR(opt, lam)]


class TagData(pl.LightningDataModule):
    def __init__(self, hp: HParams):
        super().__init__()
        self.hp = hp

    def setup(self, stage=None):
        hp = self.hp
        g = torch.Generator().manual_seed(hp.seed)
        n = hp.micro_batch * hp.batches_per_rank * 2
        x = torch.randint(0, hp.vocab, (n, hp.seq), generator=g)
        y = (x * 3 + torch.roll(x, 1, dims=1)) % hp.tags
        valid = torch.ones(n, hp.seq)
        self.ds = torch.utils.data.TensorDataset(x, y, valid)

    def train_dataloader(self):
        return torch.utils.data.DataLoader(self.ds, batch_size=self.hp.micro_batch, shuffle=False)


def main():
    hp = HParams()
    pl.seed_everything(hp.seed, workers=True)
    model = Tagger(hp)
    trainer = pl.Trainer(accelerator="cpu", devices=2, num_nodes=1, strategy="ddp", max_epochs=hp.epochs,
                         deterministic=True, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(model, datamodule=TagData(hp))
    if trainer.global_rank == 0:
        h = hashlib.sha256()
        for _, p in model.named_parameters():
            h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)


if __name__ == "__main__":
    main()
