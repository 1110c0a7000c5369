"""fairseq-style translation-ish trainer: per-epoch update frequency, DDP, SGD + Nesterov.

`--update-freq 2 4` means 2 micro-batches per update in epoch 1 and 4 from epoch 2 on
(the last value is reused, as fairseq does). Launched with torchrun.
"""
import argparse
import contextlib
import hashlib
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def get_parser():
    p = argparse.ArgumentParser()
    p.add_argument("--update-freq", type=int, nargs="+", default=[2, 4])
    p.add_argument("--max-epoch", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--seed", type=int, default=3)
    return p


class TinyEncoderClassifier(nn.Module):
    def __init__(self, vocab=64, dim=32, n_cls=8):
        super().__init__()
        self.embed_tokens = nn.Embedding(vocab, dim, padding_idx=0)
        self.layer = nn.TransformerEncoderLayer(dim, 4, 64, dropout=0.0, batch_first=True)
        self.out_proj = nn.Linear(dim, n_cls)

    def forward(self, src_tokens):
        x = self.layer(self.embed_tokens(src_tokens))
        return self.out_proj(x.mean(1))


class LabelSmoothedCE:
    def __init__(self, eps=0.1):
        self.eps = eps

    def __call__(self, model, sample):
        logits = model(sample["net_input"])
        return F.cross_entropy(logits, sample["target"], label_smoothing=self.eps)


class Trainer:
    def __init__(self, cfg, model, criterion):
        self.cfg = cfg
        self.model = model
        self.criterion = criterion
        self.optimizer = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=cfg.momentum, nesterov=True)
        self.num_updates = 0

    def maybe_no_sync(self, i, samples):
        if i < len(samples) - 1:
            return self.model.no_sync()
        return contextlib.nullcontext()

    def train_step(self, samples):
        self.model.train()
        self.optimizer.zero_grad()
        logging_loss = 0.0
        for i, sample in enumerate(samples):
            with self.maybe_no_sync(i, samples):
                loss = self.criterion(self.model, sample)
                loss = loss / len(samples)
                loss.backward()
            logging_loss += loss.item()
        self.optimizer.step()
        self.num_updates += 1
        return logging_loss


def group_batches(itr, update_freq):
    chunk = []
    for b in itr:
        chunk.append(b)
        if len(chunk) == update_freq:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def main():
    cfg = get_parser().parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)
    torch.manual_seed(cfg.seed)

    g = torch.Generator().manual_seed(1234)
    src = torch.randint(1, 64, (128, 10), generator=g)
    tgt = (src[:, :3].sum(1) % 8)
    ds = TensorDataset(src, tgt)
    sampler = DistributedSampler(ds, num_replicas=world, rank=rank, shuffle=True, seed=cfg.seed)
    loader = DataLoader(ds, batch_size=cfg.batch_size, sampler=sampler)

    model = DDP(TinyEncoderClassifier())
    trainer = Trainer(cfg, model, LabelSmoothedCE())

    for epoch in range(1, cfg.max_epoch + 1):
        sampler.set_epoch(epoch)
        uf = cfg.update_freq[min(epoch, len(cfg.update_freq)) - 1]
        batches = ({"net_input": s, "target": t} for s, t in loader)
        for samples in group_batches(batches, uf):
            loss = trainer.train_step(samples)
        if rank == 0:
            print(f"epoch {epoch} update_freq {uf} updates {trainer.num_updates} loss {loss:.4f}", flush=True)

    if rank == 0:
        h = hashlib.sha256()
        for _, p in model.module.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
