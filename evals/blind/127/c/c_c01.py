"""Token-level sequence tagger with Lightning Fabric, DDP on 2 CPU ranks.

Ranks hold different micro-batch sizes (3 and 5 sequences) with ragged lengths. A window's loss is the token sum
over the window's mean (over ranks) valid-token count; DDP's averaging then gives the all-ranks token mean.
The forward is run under no_backward_sync; the backward is issued after the context exits.
Launch with torchrun.
"""
import hashlib

import torch
import torch.nn as nn
import torch.nn.functional as F
from lightning_fabric import Fabric

VOCAB, TAGS, D, T = 40, 6, 32, 12
K = 4
MICRO_PER_RANK = 10  # windows of 4, 4, 2 per pass
PASSES = 3
LR = 0.2


class Tagger(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, D)
        self.conv = nn.Conv1d(D, D, 3, padding=1)
        self.out = nn.Linear(D, TAGS)

    def forward(self, x):
        h = self.emb(x)
        h = h + torch.relu(self.conv(h.transpose(1, 2))).transpose(1, 2)
        return self.out(h)


def rank_batches(rank):
    g = torch.Generator().manual_seed(100 + rank)
    bs = 3 if rank == 0 else 5
    out = []
    for _ in range(MICRO_PER_RANK):
        x = torch.randint(0, VOCAB, (bs, T), generator=g)
        y = torch.randint(0, TAGS, (bs, T), generator=g)
        lengths = torch.randint(2, T + 1, (bs,), generator=g)
        mask = torch.arange(T)[None, :] < lengths[:, None]
        out.append((x, y.masked_fill(~mask, -100)))
    return out


def windows(batches, k):
    for i in range(0, len(batches), k):
        yield batches[i:i + k]


def main():
    fabric = Fabric(accelerator="cpu", devices=2, strategy="ddp")
    fabric.launch()
    fabric.seed_everything(0)
    torch.use_deterministic_algorithms(True)

    model = Tagger()
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.8)
    model, opt = fabric.setup(model, opt)
    batches = rank_batches(fabric.global_rank)

    for p in range(PASSES):
        for w, window in enumerate(windows(batches, K)):
            n_local = torch.tensor(float(sum((y != -100).sum().item() for _, y in window)))
            n_mean = fabric.all_reduce(n_local, reduce_op="mean")
            for j, (x, y) in enumerate(window):
                last = j == len(window) - 1
                with fabric.no_backward_sync(model, enabled=not last):
                    logits = model(x)
                loss = F.cross_entropy(logits.reshape(-1, TAGS), y.reshape(-1), ignore_index=-100, reduction="sum") / n_mean
                fabric.backward(loss)
            opt.step()
            opt.zero_grad(set_to_none=True)
            fabric.print(f"pass {p} window {w} ({len(window)} micro) tokens/rank(mean) {n_mean.item():.1f}")

    if fabric.global_rank == 0:
        h = hashlib.sha256()
        for _, prm in model.named_parameters():
            h.update(prm.detach().float().contiguous().cpu().numpy().tobytes())
        print("FINAL_SHA256", h.hexdigest(), flush=True)
    fabric.barrier()


if __name__ == "__main__":
    main()
