"""Masked LM-style token classification with FSDP2 on 2 CPU ranks.

Micro-batches carry different numbers of valid (unmasked) tokens on each rank. Each window
is normalised by the window's valid-token count summed over all ranks; because FSDP2
averages gradients over the W ranks, the per-rank loss is multiplied by W. The epoch's tail
window is shorter (11 micro-batches per rank, K = 3). Gradients are clipped once per
optimizer step, on the sharded DTensor gradients.
"""
import hashlib
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.fsdp import fully_shard

IGNORE = -100


@dataclass
class Cfg:
    vocab: int = 50
    d: int = 32
    layers: int = 2
    seq: int = 16
    micro_bs: int = 3
    k: int = 3
    per_rank_batches: int = 11
    epochs: int = 2
    lr: float = 2e-3
    clip: float = 0.3
    seed: int = 11


class TokenTagger(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.emb = nn.Embedding(c.vocab, c.d)
        self.layers = nn.ModuleList(
            [nn.TransformerEncoderLayer(c.d, 2, 2 * c.d, dropout=0.0, batch_first=True) for _ in range(c.layers)]
        )
        self.out = nn.Linear(c.d, c.vocab)

    def forward(self, ids):
        h = self.emb(ids)
        for layer in self.layers:
            h = layer(h)
        return self.out(h)


def epoch_batches(c, epoch, rank, world):
    g = torch.Generator().manual_seed(c.seed + 97 * epoch)
    n = c.per_rank_batches * world
    ids = torch.randint(0, c.vocab, (n, c.micro_bs, c.seq), generator=g)
    labels = torch.roll(ids, 1, dims=-1)
    # variable-length padding: keep a random prefix of each row
    lengths = torch.randint(2, c.seq + 1, (n, c.micro_bs), generator=g)
    pos = torch.arange(c.seq)
    labels = labels.masked_fill(pos[None, None, :] >= lengths[..., None], IGNORE)
    return list(zip(ids[rank::world], labels[rank::world]))


def windows(batches, k):
    for s in range(0, len(batches), k):
        yield batches[s:s + k]


def sha_of(tensors):
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.detach().float().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def main():
    c = Cfg()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(c.seed)
    model = TokenTagger(c)
    for layer in model.layers:
        fully_shard(layer)
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=c.lr, betas=(0.9, 0.95), weight_decay=0.0)

    update = 0
    for epoch in range(c.epochs):
        for win in windows(epoch_batches(c, epoch, rank, world), c.k):
            n_tok = torch.tensor(float(sum(int((lab != IGNORE).sum()) for _, lab in win)))
            dist.all_reduce(n_tok)  # valid tokens in the window, all ranks
            for j, (ids, lab) in enumerate(win):
                model.set_requires_gradient_sync(j == len(win) - 1)
                logits = model(ids)
                loss_sum = F.cross_entropy(logits.flatten(0, 1), lab.flatten(), ignore_index=IGNORE, reduction="sum")
                (loss_sum * world / n_tok).backward()
            gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), c.clip)
            opt.step()
            opt.zero_grad()
            update += 1
            if rank == 0:
                print(f"epoch {epoch} update {update} window {len(win)} tokens {int(n_tok)} gnorm {float(gnorm):.3f}", flush=True)

    full = [p.full_tensor() for _, p in model.named_parameters()]
    digest = sha_of(full)
    if rank == 0:
        print(f"FINAL_SHA256 {digest}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
