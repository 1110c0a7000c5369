"""Lightning manual optimisation: a bag-of-tokens classifier with a grown vocabulary.

Encoder (embedding + MLP) on AdamW, classifier head on SGD with momentum, each with its
own StepLR. Gradients are accumulated by hand over K batches; the epoch's last window may
be shorter, so every micro-loss is divided by the size of the window it belongs to.
Both optimizers are clipped (per optimizer) right before they step.
"""
import hashlib
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F
import pytorch_lightning as pl
from torch.utils.data import DataLoader, TensorDataset

OLD_VOCAB, NEW_VOCAB, DIM, N_CLS = 40, 46, 24, 4
K = 3                 # micro-batches per optimizer step
BATCH = 5
N_SAMPLES = 80        # 40 per rank -> 8 batches per epoch -> windows 3, 3, 2
EPOCHS = 3


class BagClassifier(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.automatic_optimization = False
        self.embed = nn.EmbeddingBag(OLD_VOCAB, DIM, mode="mean")
        self.mlp = nn.Sequential(nn.Linear(DIM, DIM), nn.Tanh())
        self.head = nn.Linear(DIM, N_CLS)

    def grow_vocab(self, new_size):
        old = self.embed.weight.data
        grown = nn.EmbeddingBag(new_size, DIM, mode="mean")
        with torch.no_grad():
            grown.weight[: old.shape[0]] = old
            grown.weight[old.shape[0]:] = old.mean(0, keepdim=True)
        self.embed = grown

    def forward(self, tokens):
        return self.head(self.mlp(self.embed(tokens)))

    def _window_len(self, batch_idx):
        n = self.trainer.num_training_batches
        start = (batch_idx // K) * K
        return min(K, n - start)

    def training_step(self, batch, batch_idx):
        opt_enc, opt_head = self.optimizers()
        sch_enc, sch_head = self.lr_schedulers()
        tokens, labels = batch
        loss = F.cross_entropy(self(tokens), labels)
        self.manual_backward(loss / self._window_len(batch_idx))

        n = self.trainer.num_training_batches
        if (batch_idx + 1) % K == 0 or batch_idx + 1 == n:
            for opt in (opt_enc, opt_head):
                self.clip_gradients(opt, gradient_clip_val=0.5, gradient_clip_algorithm="norm")
            opt_enc.step()
            opt_head.step()
            opt_enc.zero_grad()
            opt_head.zero_grad()
            sch_enc.step()
            sch_head.step()

    def configure_optimizers(self):
        enc = torch.optim.AdamW(list(self.embed.parameters()) + list(self.mlp.parameters()), lr=3e-3)
        head = torch.optim.SGD(self.head.parameters(), lr=5e-2, momentum=0.9)
        return [enc, head], [torch.optim.lr_scheduler.StepLR(enc, step_size=4, gamma=0.7),
                             torch.optim.lr_scheduler.StepLR(head, step_size=4, gamma=0.7)]


def data():
    g = torch.Generator().manual_seed(3)
    tokens = torch.randint(0, NEW_VOCAB, (N_SAMPLES, 7), generator=g)
    labels = (tokens.max(-1).values + tokens[:, 0]) % N_CLS
    return TensorDataset(tokens, labels)


def main():
    pl.seed_everything(5, workers=True)
    model = BagClassifier()
    model.grow_vocab(NEW_VOCAB)
    loader = DataLoader(data(), batch_size=BATCH, shuffle=True, generator=torch.Generator().manual_seed(4))
    trainer = pl.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=EPOCHS,
                         logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, deterministic=True)
    trainer.fit(model, train_dataloaders=loader)
    if trainer.global_rank == 0:
        if len(sys.argv) > 2 and sys.argv[1] == "--dump":
            torch.save({n: p.detach().clone() for n, p in model.named_parameters()}, sys.argv[2])
        h = hashlib.sha256()
        for _, p in model.named_parameters():
            h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)


if __name__ == "__main__":
    main()
