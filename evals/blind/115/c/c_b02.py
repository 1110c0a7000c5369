"""Tiny causal LM on ragged documents, PyTorch Lightning automatic optimisation on 2 DDP ranks.

The loss is a token-level mean over the whole accumulation window: every micro-batch
carries the number of target tokens of the window it belongs to (computed when the
micro-batches are built), so short and long micro-batches weigh by their tokens.
"""
import argparse
import hashlib
import os

import pytorch_lightning as pl
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset


def get_args():
    p = argparse.ArgumentParser()
    p.add_argument("--vocab", type=int, default=80)
    p.add_argument("--d-model", type=int, default=32)
    p.add_argument("--seq-len", type=int, default=24)
    p.add_argument("--micro-batch", type=int, default=4)
    p.add_argument("--micro-batches-per-rank", type=int, default=12)
    p.add_argument("--accumulate", type=int, default=3)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--seed", type=int, default=7)
    return p.parse_args()


class WindowedTokens(Dataset):
    """Pre-built micro-batches for one rank, each tagged with its window's token count."""

    def __init__(self, args, rank, world):
        g = torch.Generator().manual_seed(args.seed)
        total = args.micro_batches_per_rank * world
        self.items = []
        all_mb = []
        for _ in range(total):
            ids = torch.randint(1, args.vocab, (args.micro_batch, args.seq_len + 1), generator=g)
            lens = torch.randint(3, args.seq_len + 1, (args.micro_batch,), generator=g)
            mask = torch.arange(args.seq_len)[None, :] < lens[:, None]
            all_mb.append({"ids": ids[:, :-1], "targets": ids[:, 1:], "mask": mask})
        mine = all_mb[rank::world]
        K = args.accumulate
        for w0 in range(0, len(mine), K):
            window = mine[w0:w0 + K]
            n_tok = sum(int(mb["mask"].sum()) for mb in window)
            for mb in window:
                self.items.append(dict(mb, win_tokens=torch.tensor(float(n_tok))))

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]


class TinyLM(pl.LightningModule):
    def __init__(self, args):
        super().__init__()
        self.save_hyperparameters(vars(args))
        self.args = args
        self.tok = nn.Embedding(args.vocab, args.d_model)
        self.pos = nn.Embedding(args.seq_len, args.d_model)
        self.block = nn.TransformerEncoderLayer(
            args.d_model, nhead=2, dim_feedforward=64, dropout=0.0, batch_first=True)
        self.ln_f = nn.LayerNorm(args.d_model)
        self.head = nn.Linear(args.d_model, args.vocab, bias=False)

    def forward(self, ids):
        t = ids.shape[1]
        x = self.tok(ids) + self.pos(torch.arange(t, device=ids.device))
        causal = nn.Transformer.generate_square_subsequent_mask(t, device=ids.device)
        x = self.block(x, src_mask=causal, is_causal=True)
        return self.head(self.ln_f(x))

    def training_step(self, batch, batch_idx):
        logits = self(batch["ids"])
        ce = F.cross_entropy(logits.flatten(0, 1), batch["targets"].flatten(), reduction="none")
        ce_sum = (ce * batch["mask"].flatten().float()).sum()
        # Lightning divides by accumulate_grad_batches and DDP averages ranks:
        # undo the / K so the window sums to a token mean.
        K = self.trainer.accumulate_grad_batches
        loss = ce_sum * K / batch["win_tokens"]
        self.log("train_loss", loss.detach() / K, prog_bar=False)
        return loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=self.args.lr, betas=(0.9, 0.95),
                                 weight_decay=0.05)

    def train_dataloader(self):
        ds = WindowedTokens(self.args, self.global_rank, self.trainer.world_size)
        return DataLoader(ds, batch_size=None, shuffle=False)


def main():
    args = get_args()
    pl.seed_everything(args.seed, workers=True)
    model = TinyLM(args)
    trainer = pl.Trainer(
        accelerator="cpu", devices=2, strategy="ddp", max_epochs=args.epochs,
        accumulate_grad_batches=args.accumulate, use_distributed_sampler=False,
        deterministic=True, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False,
    )
    trainer.fit(model)
    if trainer.global_rank == 0:
        h = hashlib.sha256()
        flat = []
        for _, p in model.named_parameters():
            t = p.detach().float().cpu().contiguous()
            h.update(t.numpy().tobytes())
            flat.append(t.reshape(-1))
        if os.environ.get("PARAM_DUMP"):
            torch.save(torch.cat(flat), os.environ["PARAM_DUMP"])
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)


if __name__ == "__main__":
    main()
