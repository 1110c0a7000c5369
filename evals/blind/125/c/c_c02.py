"""Lightning next-token model with a vocabulary grown for new special tokens, a frozen
sinusoidal-initialised position table, a worker DataLoader, accumulate_grad_batches=3,
norm clipping and a warm-up/linear-decay schedule stepped per optimizer step.
"""
import hashlib
import math

import torch
import torch.nn as nn
import torch.nn.functional as F
import pytorch_lightning as pl
from torch.utils.data import DataLoader, Dataset

BASE_VOCAB = 40
NEW_TOKENS = 3
SEQ = 16
DIM = 32
SEED = 2024


class TokenDataset(Dataset):
    def __init__(self, n=144):
        g = torch.Generator().manual_seed(SEED)
        seqs = torch.randint(0, BASE_VOCAB, (n, SEQ + 1), generator=g)
        # wrap some sequences with the newly added special tokens
        seqs[::3, 0] = BASE_VOCAB          # <bos>
        seqs[1::4, -1] = BASE_VOCAB + 1    # <eos>
        seqs[2::5, SEQ // 2] = BASE_VOCAB + 2  # <sep>
        self.seqs = seqs

    def __len__(self):
        return len(self.seqs)

    def __getitem__(self, i):
        return self.seqs[i, :-1], self.seqs[i, 1:]


class TinyLM(nn.Module):
    def __init__(self, vocab):
        super().__init__()
        self.tok = nn.Embedding(vocab, DIM)
        pos = torch.arange(SEQ)[:, None] / (10000 ** (torch.arange(DIM)[None, :] / DIM))
        self.pos = nn.Parameter(torch.where(torch.arange(DIM) % 2 == 0, pos.sin(), pos.cos()))
        self.mix = nn.Sequential(nn.Linear(DIM, 64), nn.GELU(), nn.Linear(64, DIM))
        self.norm = nn.LayerNorm(DIM)
        self.out = nn.Linear(DIM, vocab)

    def resize_vocab(self, new_vocab):
        old_tok, old_out = self.tok, self.out
        self.tok = nn.Embedding(new_vocab, DIM)
        self.out = nn.Linear(DIM, new_vocab)
        with torch.no_grad():
            self.tok.weight[: old_tok.num_embeddings] = old_tok.weight
            self.tok.weight[old_tok.num_embeddings:] = old_tok.weight.mean(0, keepdim=True)
            self.out.weight[: old_out.out_features] = old_out.weight
            self.out.bias[: old_out.out_features] = old_out.bias

    def forward(self, x):
        h = self.tok(x) + self.pos[: x.size(1)]
        # causal running mean as a cheap token mixer
        h = torch.cumsum(h, 1) / torch.arange(1, x.size(1) + 1)[None, :, None]
        h = h + self.mix(self.norm(h))
        return self.out(self.norm(h))


class LitLM(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = TinyLM(BASE_VOCAB)
        self.net.resize_vocab(BASE_VOCAB + NEW_TOKENS)
        self.net.pos.requires_grad_(False)

    def training_step(self, batch, batch_idx):
        x, y = batch
        logits = self.net(x)
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1))

    def configure_optimizers(self):
        params = [p for p in self.parameters() if p.requires_grad]
        opt = torch.optim.AdamW(params, lr=4e-3, weight_decay=0.05)
        total = self.trainer.estimated_stepping_batches
        warm = 2

        def lr_lambda(step):
            if step < warm:
                return (step + 1) / warm
            return max(0.05, 1 - (step - warm) / max(1, total - warm))

        sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def main():
    pl.seed_everything(SEED, workers=True)
    model = LitLM()
    # 144 samples / 2 ranks / micro-batch 6 = 12 micro-batches per rank per epoch = 4 windows of 3
    loader = DataLoader(TokenDataset(), batch_size=6, shuffle=False, num_workers=1)
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        max_epochs=2,
        accumulate_grad_batches=3,
        gradient_clip_val=0.3,
        gradient_clip_algorithm="norm",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        deterministic=True,
    )
    trainer.fit(model, loader)
    if trainer.global_rank == 0:
        print(f"optimizer steps: {trainer.global_step}")
        h = hashlib.sha256()
        for _, p in model.named_parameters():
            h.update(p.detach().to(torch.float32).contiguous().cpu().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}")


if __name__ == "__main__":
    main()
