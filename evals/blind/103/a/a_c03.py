"""Lightning token tagger on 2 DDP ranks, K = 3 over epochs of 8 batches
(windows 3, 3, 2). Each micro-batch carries the token count of its whole
window over all ranks; the loss is the token sum over that count x world size
x K (Lightning divides every micro-batch by accumulate_grad_batches, also in
the short window). Frozen pretrained-style embedding, a clip that acts."""
import hashlib

import pytorch_lightning as pl
import torch
import torch.nn as nn
import torch.nn.functional as F
from pytorch_lightning.strategies import DDPStrategy
from torch.utils.data import DataLoader, Dataset

K = 3
WORLD = 2
BATCHES_PER_RANK = 8
BS = 4
SEQ = 12
VOCAB = 50
TAGS = 7


def build_rank_batches(seed):
    """Micro-batches for every rank, grouped in windows; each carries its window's all-ranks count."""
    g = torch.Generator().manual_seed(seed)
    per_rank = [[] for _ in range(WORLD)]
    for r in range(WORLD):
        for _ in range(BATCHES_PER_RANK):
            lens = torch.randint(2, SEQ + 1, (BS,), generator=g)
            mask = torch.arange(SEQ)[None, :] < lens[:, None]
            x = torch.randint(1, VOCAB, (BS, SEQ), generator=g) * mask
            y = torch.where(mask, (x * 3 + 1) % TAGS, torch.full_like(x, -100))
            per_rank[r].append({"x": x, "y": y})
    starts = list(range(0, BATCHES_PER_RANK, K))
    for s in starts:
        idx = range(s, min(s + K, BATCHES_PER_RANK))
        n_win = sum(int((per_rank[r][i]["y"] != -100).sum()) for r in range(WORLD) for i in idx)
        for r in range(WORLD):
            for i in idx:
                per_rank[r][i]["n_win"] = torch.tensor(float(n_win))
    return per_rank


class PreBatched(Dataset):
    def __init__(self, batches):
        self.batches = batches

    def __len__(self):
        return len(self.batches)

    def __getitem__(self, i):
        return self.batches[i]


class Tagger(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, 24, padding_idx=0)
        self.emb.weight.requires_grad_(False)          # kept frozen
        self.mix = nn.Conv1d(24, 32, kernel_size=3, padding=1)
        self.cls = nn.Linear(32, TAGS)

    def training_step(self, batch, batch_idx):
        h = self.emb(batch["x"]).transpose(1, 2)
        logits = self.cls(F.gelu(self.mix(h)).transpose(1, 2))
        s = F.cross_entropy(logits.reshape(-1, TAGS), batch["y"].reshape(-1),
                            ignore_index=-100, reduction="sum")
        return s * self.trainer.world_size * self.trainer.accumulate_grad_batches / batch["n_win"]

    def configure_optimizers(self):
        return torch.optim.AdamW([p for p in self.parameters() if p.requires_grad], lr=1e-2)


class Data(pl.LightningDataModule):
    def setup(self, stage=None):
        self.mine = build_rank_batches(seed=99)[self.trainer.global_rank]

    def train_dataloader(self):
        return DataLoader(PreBatched(self.mine), batch_size=None, shuffle=False)


def main():
    pl.seed_everything(17)
    model = Tagger()
    trainer = pl.Trainer(
        accelerator="cpu", devices=WORLD, strategy=DDPStrategy(process_group_backend="gloo"),
        max_epochs=3, accumulate_grad_batches=K, gradient_clip_val=0.3,
        use_distributed_sampler=False, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, deterministic=True,
    )
    trainer.fit(model, datamodule=Data())
    if trainer.is_global_zero:
        h = hashlib.sha256()
        for _, p in model.named_parameters():
            h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
        print("optimizer steps:", trainer.global_step)
        print("FINAL_SHA256", h.hexdigest())


if __name__ == "__main__":
    main()
