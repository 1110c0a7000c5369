"""FSDP2 sequence tagger: bf16 compute, fp32 gradient reduction, two optimizers.

Each rank sees 8 micro-batches per epoch and K = 3, so every epoch ends in a
short window of 2 (windows 3-3-2).  A window's loss is the mean over the
micro-batches it actually holds.  The blocks are their own FSDP units and are
left to reduce-scatter on every micro-step (their sharded fp32 .grad sums the
pieces); only the root unit's own parameters defer their reduction to the
window's last micro-step.  Positions are a frozen sinusoidal table.
"""
import hashlib, math

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard, MixedPrecisionPolicy
from torch.distributed.tensor import DTensor

K, EPOCHS, PER_EPOCH, BS, SEQ, D, TAGS = 3, 2, 8, 4, 12, 32, 6


def sinusoid(n, d):
    pos = torch.arange(n).float()[:, None]
    i = torch.arange(0, d, 2).float()
    ang = pos / (10000 ** (i / d))
    pe = torch.zeros(n, d)
    pe[:, 0::2], pe[:, 1::2] = torch.sin(ang), torch.cos(ang)
    return pe


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln = nn.LayerNorm(D)
        self.mix = nn.Linear(D, D)
        self.ff = nn.Sequential(nn.Linear(D, 2 * D), nn.GELU(), nn.Linear(2 * D, D))

    def forward(self, x):
        h = self.ln(x)
        return x + self.ff(h + self.mix(h).cumsum(1) / (1 + torch.arange(x.shape[1], device=x.device)[None, :, None]))


class Tagger(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(50, D)
        self.pos = nn.Parameter(sinusoid(SEQ, D), requires_grad=False)
        self.blocks = nn.ModuleList([Block(), Block()])
        self.cls = nn.Linear(D, TAGS)

    def forward(self, x):
        h = self.tok(x) + self.pos[None]
        for b in self.blocks:
            h = b(h)
        return self.cls(h)


def epoch_batches(rank, epoch):
    g = torch.Generator().manual_seed(1000 * epoch + rank)
    for _ in range(PER_EPOCH):
        x = torch.randint(0, 50, (BS, SEQ), generator=g)
        yield x, (x + x.roll(1, 1)) % TAGS


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = Tagger()
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for b in model.blocks:
        fully_shard(b, mp_policy=mp)
    fully_shard(model, mp_policy=mp)

    head = list(model.cls.parameters())
    body = [p for n, p in model.named_parameters() if p.requires_grad and not n.startswith("cls.")]
    opt_body = torch.optim.AdamW(body, lr=3e-3, weight_decay=0.05)
    opt_head = torch.optim.SGD(head, lr=0.1, momentum=0.9, nesterov=True)

    for epoch in range(EPOCHS):
        window = []
        for j, batch in enumerate(epoch_batches(rank, epoch)):
            window.append(batch)
            if len(window) < K and j + 1 < PER_EPOCH:
                continue
            n = len(window)
            for m, (x, y) in enumerate(window):
                model.set_requires_gradient_sync(m == n - 1, recurse=False)
                logits = model(x).float()
                loss = F.cross_entropy(logits.reshape(-1, TAGS), y.reshape(-1)) / n
                loss.backward()
            for o in (opt_body, opt_head):
                o.step()
                o.zero_grad()
            window = []

    h = hashlib.sha256()
    for _, p in model.named_parameters():
        full = p.full_tensor() if isinstance(p, DTensor) else p
        t = full.detach().float().contiguous()
        h.update(t.numpy().tobytes())
    if rank == 0:
        print("FINAL_SHA256", h.hexdigest(), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
