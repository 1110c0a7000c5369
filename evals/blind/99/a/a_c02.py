"""Lightning manual optimisation: a sequence encoder (AdamW) and a classifier head
(SGD with momentum), accumulating K=3 batches per update over DDP.

An epoch holds 8 batches per rank, so the last window of each epoch has 2 batches;
each window's loss is divided by its real size. The clip (0.5) and both schedulers
act once per update.
"""
import hashlib
import os

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset
import pytorch_lightning as pl
from pytorch_lightning.strategies import DDPStrategy

K = 3
BATCH = 3
EPOCHS = 3
N_SAMPLES = 48   # 24 per rank -> 8 batches per rank per epoch


def make_data(seed=5):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(N_SAMPLES, 10, 8, generator=g)
    y = ((x[:, :5, 0].sum(1) - x[:, 5:, 1].sum(1)) > 0).long() + (x[:, :, 2].max(1).values > 1.8).long()
    return TensorDataset(x, y)


class SeqClassifier(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.automatic_optimization = False
        self.encoder = nn.GRU(8, 32, batch_first=True)
        self.head = nn.Sequential(nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 3))

    def _window_size(self, batch_idx):
        n = self.trainer.num_training_batches
        start = (batch_idx // K) * K
        return min(K, n - start)

    def training_step(self, batch, batch_idx):
        opt_enc, opt_head = self.optimizers()
        sch_enc, sch_head = self.lr_schedulers()
        x, y = batch
        _, h = self.encoder(x)
        loss = F.cross_entropy(self.head(h[-1]), y)
        self.manual_backward(loss / self._window_size(batch_idx))

        last_of_window = (batch_idx + 1) % K == 0 or (batch_idx + 1) == self.trainer.num_training_batches
        if last_of_window:
            self.clip_gradients(opt_enc, gradient_clip_val=0.5, gradient_clip_algorithm="norm")
            self.clip_gradients(opt_head, gradient_clip_val=0.5, gradient_clip_algorithm="norm")
            opt_enc.step()
            opt_head.step()
            opt_enc.zero_grad()
            opt_head.zero_grad()
            sch_enc.step()
            sch_head.step()
        self.log("loss", loss.detach(), prog_bar=False)

    def configure_optimizers(self):
        opt_enc = torch.optim.AdamW(self.encoder.parameters(), lr=3e-3, weight_decay=0.01)
        opt_head = torch.optim.SGD(self.head.parameters(), lr=0.05, momentum=0.9)
        sch_enc = torch.optim.lr_scheduler.LinearLR(opt_enc, start_factor=0.3, total_iters=4)
        sch_head = torch.optim.lr_scheduler.ExponentialLR(opt_head, gamma=0.9)
        return [opt_enc, opt_head], [sch_enc, sch_head]


def params_sha256(module):
    h = hashlib.sha256()
    flat = []
    for _, p in module.named_parameters():
        t = p.detach().float().cpu().contiguous()
        h.update(t.numpy().tobytes())
        flat.append(t.reshape(-1))
    if os.environ.get("A_DUMP"):
        torch.save(torch.cat(flat), os.environ["A_DUMP"])
    return h.hexdigest()


def main():
    pl.seed_everything(3, workers=True)
    torch.use_deterministic_algorithms(True)
    model = SeqClassifier()
    trainer = pl.Trainer(accelerator="cpu", devices=2, strategy=DDPStrategy(process_group_backend="gloo"),
                         max_epochs=EPOCHS, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, deterministic=True)
    trainer.fit(model, DataLoader(make_data(), batch_size=BATCH, shuffle=False))
    if trainer.is_global_zero:
        print(f"FINAL_SHA256 {params_sha256(model)}", flush=True)


if __name__ == "__main__":
    main()
