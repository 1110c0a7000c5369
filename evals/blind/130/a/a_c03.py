"""FSDP2 fine-tuning of a tiny token tagger whose vocabulary is grown before sharding.

Padded sequences of ragged length (masked targets), windows of 3-3-2 micro-batches per
epoch, the loss over the window's valid-token count on all ranks, gradient sync deferred
to each window's last micro-batch, a clip that acts, a frozen position table and a
DataLoader worker process.

    torchrun --nproc-per-node 2 --master-addr 127.0.0.1 --master-port 49051 a_c03.py
"""
import hashlib
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.fsdp import fully_shard
from torch.utils.data import DataLoader, Dataset

IGNORE = -100


@dataclass
class Cfg:
    vocab: int = 50
    extra_tokens: int = 6
    d: int = 32
    n_tags: int = 7
    max_len: int = 14
    micro: int = 4
    accum: int = 3
    batches_per_epoch: int = 8
    epochs: int = 3
    lr: float = 3e-3
    clip: float = 0.2
    seed: int = 41


class RaggedTags(Dataset):
    def __init__(self, cfg, rank, epoch):
        g = torch.Generator().manual_seed(cfg.seed * 97 + rank * 7 + epoch)
        self.items = []
        for _ in range(cfg.micro * cfg.batches_per_epoch):
            n = int(torch.randint(3, cfg.max_len + 1, (1,), generator=g))
            ids = torch.randint(0, cfg.vocab + cfg.extra_tokens, (n,), generator=g)
            tags = (ids * 3 + torch.arange(n)) % cfg.n_tags
            self.items.append((ids, tags))

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]


def collate(batch, max_len=14):
    ids = torch.zeros(len(batch), max_len, dtype=torch.long)
    tags = torch.full((len(batch), max_len), IGNORE, dtype=torch.long)
    for j, (a, b) in enumerate(batch):
        ids[j, : len(a)] = a
        tags[j, : len(b)] = b
    return ids, tags


class Tagger(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.tok = nn.Embedding(cfg.vocab, cfg.d)
        self.pos = nn.Embedding(cfg.max_len, cfg.d)
        self.enc = nn.Sequential(nn.Linear(cfg.d, 2 * cfg.d), nn.GELU(), nn.Linear(2 * cfg.d, cfg.d))
        self.out = nn.Linear(cfg.d, cfg.n_tags)

    def forward(self, ids):
        h = self.tok(ids) + self.pos(torch.arange(ids.shape[1]))
        h = h + self.enc(h)
        return self.out(h)


def grow_vocab(model, extra):
    old = model.tok.weight.data
    new = nn.Embedding(old.shape[0] + extra, old.shape[1])
    with torch.no_grad():
        new.weight[: old.shape[0]] = old
        new.weight[old.shape[0]:] = old.mean(0, keepdim=True)
    model.tok = new


def build(cfg):
    torch.manual_seed(cfg.seed)
    model = Tagger(cfg)
    grow_vocab(model, cfg.extra_tokens)
    model.pos.weight.requires_grad_(False)
    fully_shard(model.enc)
    fully_shard(model)
    return model


def main():
    cfg = Cfg()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    model = build(cfg)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=0.0)

    for epoch in range(cfg.epochs):
        loader = DataLoader(RaggedTags(cfg, rank, epoch), batch_size=cfg.micro, shuffle=False,
                            collate_fn=collate, num_workers=1)
        batches = list(loader)
        for start in range(0, len(batches), cfg.accum):
            window = batches[start:start + cfg.accum]
            n_tok = torch.tensor(float(sum((t != IGNORE).sum().item() for _, t in window)))
            dist.all_reduce(n_tok)
            for j, (ids, tags) in enumerate(window):
                model.set_requires_gradient_sync(j == len(window) - 1)
                logits = model(ids)
                loss = F.cross_entropy(logits.flatten(0, 1), tags.flatten(), ignore_index=IGNORE,
                                       reduction="sum") * world / n_tok
                loss.backward()
            norm = torch.nn.utils.clip_grad_norm_(params, cfg.clip)
            opt.step()
            opt.zero_grad(set_to_none=True)
        if rank == 0:
            print(f"epoch {epoch} last loss {loss.item():.4f} grad norm {float(norm):.3f}", flush=True)

    h = hashlib.sha256()
    for _, p in model.named_parameters():
        full = p.full_tensor() if hasattr(p, "full_tensor") else p
        h.update(full.detach().float().contiguous().numpy().tobytes())
    if rank == 0:
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
