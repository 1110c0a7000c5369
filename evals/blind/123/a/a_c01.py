"""Padded-sequence LM on FSDP2 (fully_shard per block + root), 2 ranks.

Windows of K = 3 micro-batches are read ahead so the window's token count over all ranks
is known before the first backward. Each epoch has 8 micro-batches per rank, so windows
are 3-3-2; the short window is normalised by its own token count. Reduce-scatter is
deferred until the window's last backward. Two optimizers: SGD for the embedding,
AdamW for the rest; one global-norm clip (0.3) over both.
"""
import hashlib
import os

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

VOCAB, DIM, SEQ, PAD = 50, 32, 14, 0
MICRO_BS, K, EPOCHS = 4, 3, 2
MICRO_PER_EPOCH = 8
SEED = 11


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.ln = nn.LayerNorm(d)
        self.ff = nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))

    def forward(self, x):
        return x + self.ff(self.ln(x))


class PaddedLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, DIM, padding_idx=PAD)
        self.blocks = nn.ModuleList([Block(DIM) for _ in range(2)])
        self.out = nn.Linear(DIM, VOCAB)

    def forward(self, ids):
        h = self.emb(ids)
        # causal-ish mixing: cumulative mean over positions
        h = h.cumsum(1) / torch.arange(1, ids.size(1) + 1).view(1, -1, 1)
        for b in self.blocks:
            h = b(h)
        return self.out(h)


def make_epoch(rank, epoch):
    g = torch.Generator().manual_seed(SEED * 1000 + rank * 100 + epoch)
    batches = []
    for _ in range(MICRO_PER_EPOCH):
        ids = torch.randint(1, VOCAB, (MICRO_BS, SEQ + 1), generator=g)
        lengths = torch.randint(3, SEQ + 2, (MICRO_BS,), generator=g)
        mask = torch.arange(SEQ + 1).view(1, -1) < lengths.view(-1, 1)
        ids = ids.masked_fill(~mask, PAD)
        labels = ids[:, 1:].clone()
        labels[~mask[:, 1:]] = -100
        batches.append((ids[:, :-1].contiguous(), labels))
    return batches


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(SEED)
    model = PaddedLM()
    for blk in model.blocks:
        fully_shard(blk)
    fully_shard(model)

    emb_params = list(model.emb.parameters())
    emb_ids = {id(p) for p in emb_params}
    rest = [p for p in model.parameters() if id(p) not in emb_ids]
    opt_emb = torch.optim.SGD(emb_params, lr=0.05, momentum=0.9)
    opt_rest = torch.optim.AdamW(rest, lr=3e-3, weight_decay=0.01)
    optimizers = [opt_emb, opt_rest]

    step = 0
    for epoch in range(EPOCHS):
        batches = make_epoch(rank, epoch)
        for w0 in range(0, len(batches), K):
            window = batches[w0:w0 + K]
            n_tok = torch.tensor(sum(int((lab != -100).sum()) for _, lab in window), dtype=torch.float64)
            dist.all_reduce(n_tok, op=dist.ReduceOp.SUM)
            for j, (ids, labels) in enumerate(window):
                model.set_requires_gradient_sync(j == len(window) - 1)
                logits = model(ids)
                tok_sum = F.cross_entropy(logits.reshape(-1, VOCAB), labels.reshape(-1),
                                          ignore_index=-100, reduction="sum")
                # FSDP2 averages over ranks; multiply by world to get sum / global count
                loss = tok_sum * world / n_tok.item()
                loss.backward()
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=0.3)
            for opt in optimizers:
                opt.step()
            for opt in optimizers:
                opt.zero_grad(set_to_none=True)
            step += 1
            if rank == 0:
                gn = norm.full_tensor() if isinstance(norm, DTensor) else norm
                print(f"epoch {epoch} step {step} window {len(window)} tokens {int(n_tok.item())} "
                      f"grad_norm {float(gn):.4f}", flush=True)

    h = hashlib.sha256()
    for _, p in model.named_parameters():
        full = p.full_tensor() if isinstance(p, DTensor) else p
        h.update(full.detach().float().contiguous().numpy().tobytes())
    if rank == 0:
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
