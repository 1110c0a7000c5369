"""FSDP2 causal-LM training on variable-length (padded) sequences.

Token-level loss normalised over every valid token of the window on all ranks,
so micro-batches with few tokens weigh less. The epoch is 10 micro-batches per
rank and K = 4, so each epoch ends with a short window of 2 that is still
stepped and normalised by its own token count. The gradient is clipped on the
sharded DTensor gradients before the step.
"""
import hashlib

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.fsdp import fully_shard

VOCAB, DIM, SEQ = 80, 48, 20
MICRO_BS, K, MICROS_PER_EPOCH, EPOCHS = 4, 4, 10, 2
IGNORE = -100


class LookbackLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, DIM)
        self.body = nn.Sequential(nn.Linear(DIM, 2 * DIM), nn.GELU(), nn.Linear(2 * DIM, DIM))
        self.mix = nn.Linear(2 * DIM, DIM)
        self.out = nn.Linear(DIM, VOCAB)

    def forward(self, ids):
        x = self.emb(ids)
        prev = torch.cat([torch.zeros_like(x[:, :1]), x[:, :-1]], 1)  # one-token lookback
        h = self.mix(torch.cat([x, prev], -1))
        h = h + self.body(h)
        return self.out(h)


def epoch_batches(epoch, rank, world):
    g = torch.Generator().manual_seed(99 + epoch)
    n = MICROS_PER_EPOCH * MICRO_BS * world
    ids = torch.randint(1, VOCAB, (n, SEQ + 1), generator=g)
    ids[:, 1::2] = (ids[:, :-1:2] * 3) % VOCAB
    lengths = torch.randint(4, SEQ + 1, (n,), generator=g)
    labels = ids[:, 1:].clone()
    pos = torch.arange(SEQ).expand(n, SEQ)
    labels[pos >= lengths[:, None]] = IGNORE
    ids, labels = ids[rank::world, :-1], labels[rank::world]
    return [(ids[i:i + MICRO_BS], labels[i:i + MICRO_BS]) for i in range(0, ids.shape[0], MICRO_BS)]


def param_groups(model, wd):
    decay, no_decay = [], []
    for n, p in model.named_parameters():
        (no_decay if p.ndim < 2 else decay).append(p)
    return [{"params": decay, "weight_decay": wd}, {"params": no_decay, "weight_decay": 0.0}]


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = LookbackLM()
    fully_shard(model.body)
    fully_shard(model)
    opt = torch.optim.AdamW(param_groups(model, 0.05), lr=4e-3, betas=(0.9, 0.95))

    step = 0
    for epoch in range(EPOCHS):
        batches = epoch_batches(epoch, rank, world)
        for w0 in range(0, len(batches), K):
            window = batches[w0:w0 + K]
            n_tok = torch.tensor(sum(int((lab != IGNORE).sum()) for _, lab in window), dtype=torch.float64)
            dist.all_reduce(n_tok)
            for j, (ids, lab) in enumerate(window):
                model.set_requires_gradient_sync(j == len(window) - 1)
                logits = model(ids)
                loss_sum = F.cross_entropy(logits.reshape(-1, VOCAB), lab.reshape(-1),
                                           ignore_index=IGNORE, reduction="sum")
                # FSDP averages over ranks, hence the * world
                (loss_sum * world / n_tok.item()).backward()
            gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), 0.45)
            opt.step()
            opt.zero_grad()
            step += 1
            if rank == 0:
                print(f"step {step} window {len(window)} tokens {int(n_tok)} gnorm {gnorm.full_tensor():.3f}",
                      flush=True)

    h = hashlib.sha256()
    for _, p in model.named_parameters():
        h.update(p.full_tensor().detach().float().contiguous().numpy().tobytes())
    if rank == 0:
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
