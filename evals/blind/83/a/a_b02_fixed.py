"""Token-level LM training in PyTorch Lightning, loss normalised over the accumulation window.

torchrun --nproc-per-node 2 --master-addr 127.0.0.1 --master-port 34004 a_b02_fixed.py
"""
import argparse
import hashlib

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset
import pytorch_lightning as pl

IGNORE = -100


def get_args():
    p = argparse.ArgumentParser()
    p.add_argument("--vocab", type=int, default=96)
    p.add_argument("--seq-len", type=int, default=20)
    p.add_argument("--micro-bs", type=int, default=4)
    p.add_argument("--accum", type=int, default=3)
    p.add_argument("--micro-batches", type=int, default=24, help="micro-batches per epoch, all ranks")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--lr", type=float, default=5e-3)
    p.add_argument("--seed", type=int, default=7)
    return p.parse_args()


def make_micro_batches(args):
    """Pre-collated, right-padded micro-batches with ragged lengths."""
    g = torch.Generator().manual_seed(args.seed)
    out = []
    for _ in range(args.micro_batches):
        ids = torch.randint(1, args.vocab, (args.micro_bs, args.seq_len), generator=g)
        ids[:, 1:] = torch.where(torch.rand(args.micro_bs, args.seq_len - 1, generator=g) < 0.5,
                                 (ids[:, :-1] * 3) % args.vocab, ids[:, 1:])
        lens = torch.randint(3, args.seq_len + 1, (args.micro_bs,), generator=g)
        pos = torch.arange(args.seq_len)[None, :]
        labels = ids.clone()
        labels[pos >= lens[:, None]] = IGNORE
        ids[pos >= lens[:, None]] = 0
        out.append({"input_ids": ids, "labels": labels})
    return out


class MicroBatchShard(Dataset):
    def __init__(self, items):
        self.items = items

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]


class TinyLM(nn.Module):
    def __init__(self, vocab, d=48):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.rnn = nn.GRU(d, d, batch_first=True)
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab)

    def forward(self, ids):
        h, _ = self.rnn(self.emb(ids))
        return self.head(self.norm(h))


class LitLM(pl.LightningModule):
    def __init__(self, args):
        super().__init__()
        self.args = args
        self.net = TinyLM(args.vocab)
        self.window_tokens = None

    def train_dataloader(self):
        rank, world = self.global_rank, self.trainer.world_size
        shard = make_micro_batches(self.args)[rank::world]
        k = self.args.accum
        counts = []
        for w in range(0, len(shard), k):
            n = sum(int((mb["labels"][:, 1:] != IGNORE).sum()) for mb in shard[w:w + k])
            counts.append(n)
        self.window_tokens = torch.tensor(counts, dtype=torch.float32)
        self.window_tokens = self.trainer.strategy.reduce(self.window_tokens, reduce_op="sum") / world
        return DataLoader(MicroBatchShard(shard), batch_size=None, shuffle=False)

    def training_step(self, batch, batch_idx):
        logits = self.net(batch["input_ids"])
        tok_loss = F.cross_entropy(logits[:, :-1].reshape(-1, logits.size(-1)),
                                   batch["labels"][:, 1:].reshape(-1),
                                   ignore_index=IGNORE, reduction="sum")
        n_window = self.window_tokens[batch_idx // self.args.accum]
        # Lightning divides by accumulate_grad_batches, so multiply it back in:
        # the window's gradient is then sum(token losses) / n_window.
        return tok_loss * self.args.accum / n_window

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=self.args.lr, weight_decay=0.0)


def params_sha(model):
    h = hashlib.sha256()
    for _, p in model.named_parameters():
        h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def main():
    args = get_args()
    pl.seed_everything(args.seed, workers=True)
    module = LitLM(args)
    trainer = pl.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=args.epochs,
                         accumulate_grad_batches=args.accum, use_distributed_sampler=False,
                         deterministic=True, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(module)
    if trainer.is_global_zero:
        print(f"FINAL_SHA256 {params_sha(module)}", flush=True)


if __name__ == "__main__":
    main()
