"""Lightning (manual optimisation) text classifier with gradient accumulation.

Manual optimisation because the real job alternates a feature-matching step;
here only the supervised part is kept. Runs under torchrun on 2 CPU ranks.
"""
import hashlib, os
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
import pytorch_lightning as pl
from torch.utils.data import DataLoader, TensorDataset


@dataclass
class Cfg:
    vocab: int = 64
    dim: int = 32
    classes: int = 5
    seq: int = 12
    micro_bs: int = 4
    accum: int = 3
    n_per_rank: int = 96          # 24 micro-batches -> 8 updates per rank
    lr: float = 2e-3
    seed: int = 7


class BagClassifier(pl.LightningModule):
    def __init__(self, cfg: Cfg):
        super().__init__()
        self.cfg = cfg
        self.automatic_optimization = False
        self.emb = nn.EmbeddingBag(cfg.vocab, cfg.dim, mode="mean")
        self.ff = nn.Sequential(nn.Linear(cfg.dim, cfg.dim), nn.GELU(), nn.Linear(cfg.dim, cfg.classes))

    def forward(self, tokens):
        return self.ff(self.emb(tokens))

    def training_step(self, batch, batch_idx):
        opt = self.optimizers()
        opt.zero_grad()
        tokens, labels = batch
        loss = F.cross_entropy(self(tokens), labels) / self.cfg.accum
        self.manual_backward(loss)
        if (batch_idx + 1) % self.cfg.accum == 0:
            opt.step()
        self.log("loss", loss.detach() * self.cfg.accum, prog_bar=False)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=self.cfg.lr, weight_decay=0.01)


def make_data(cfg: Cfg, world: int):
    g = torch.Generator().manual_seed(cfg.seed)
    n = cfg.n_per_rank * world
    tokens = torch.randint(0, cfg.vocab, (n, cfg.seq), generator=g)
    labels = (tokens[:, :3].sum(1) % cfg.classes)
    return TensorDataset(tokens, labels)


def param_sha(module):
    h = hashlib.sha256()
    for _, p in module.named_parameters():
        h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
    if os.environ.get("PARAM_DUMP"):
        torch.save([p.detach().float().cpu() for _, p in module.named_parameters()], os.environ["PARAM_DUMP"])
    return h.hexdigest()


def main():
    cfg = Cfg()
    pl.seed_everything(cfg.seed, workers=True)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    model = BagClassifier(cfg)
    # the DistributedSampler Lightning inserts splits the set between the 2 ranks
    loader = DataLoader(make_data(cfg, world), batch_size=cfg.micro_bs, shuffle=False)
    trainer = pl.Trainer(
        accelerator="cpu", devices=2, num_nodes=1, strategy="ddp", max_epochs=1,
        logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, deterministic=True,
    )
    trainer.fit(model, loader)
    if trainer.global_rank == 0:
        print("FINAL_SHA256", param_sha(model))


if __name__ == "__main__":
    main()
