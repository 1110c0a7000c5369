"""Lightning Fabric token tagger, 2 DDP ranks, K=2, two optimizers, resumed into fresh objects.

The loss of a window is the sum over valid tokens divided by the window's all-ranks valid
count, times W (DDP averages over ranks). Only the forward runs under `no_backward_sync`:
DDP decides at forward time whether the coming backward reduces.
"""
import hashlib
import os

import torch
import torch.nn as nn
import torch.distributed as dist
from lightning_fabric import Fabric

K = 2
STEPS_BEFORE_SAVE = 3
TOTAL_STEPS = 8
MB = 3
T = 8
VOCAB = 30
TAGS = 6
CKPT = os.path.join("tmp_scratch", "a_c02_ckpt.pt")


class Tagger(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, 24)
        self.mix = nn.Conv1d(24, 24, 3, padding=1)
        self.head = nn.Linear(24, TAGS)

    def forward(self, x):
        h = self.emb(x)
        h = torch.relu(self.mix(h.transpose(1, 2))).transpose(1, 2) + h
        return self.head(h)


def micro_batch(rank, idx):
    g = torch.Generator().manual_seed(1000 * rank + idx)
    x = torch.randint(0, VOCAB, (MB, T), generator=g)
    y = (x * 7 + 3) % TAGS
    lengths = torch.randint(2, T + 1, (MB,), generator=g)
    valid = torch.arange(T)[None, :] < lengths[:, None]
    y = y.masked_fill(~valid, -100)
    return x, y


def build(fabric):
    model = Tagger()
    opt_body = torch.optim.AdamW(list(model.emb.parameters()) + list(model.mix.parameters()), lr=4e-3)
    opt_head = torch.optim.SGD(model.head.parameters(), lr=0.1, momentum=0.9)
    model = fabric.setup_module(model)
    opt_body, opt_head = fabric.setup_optimizers(opt_body, opt_head)
    return model, opt_body, opt_head


def run_steps(fabric, model, opts, start, stop):
    W = fabric.world_size
    for step in range(start, stop):
        batches = [micro_batch(fabric.global_rank, step * K + j) for j in range(K)]
        n = torch.tensor(float(sum((y != -100).sum() for _, y in batches)))
        dist.all_reduce(n)
        for j, (x, y) in enumerate(batches):
            with fabric.no_backward_sync(model, enabled=(j < K - 1)):
                logits = model(x)
            loss = nn.functional.cross_entropy(logits.reshape(-1, TAGS), y.reshape(-1),
                                               ignore_index=-100, reduction="sum") * W / n
            fabric.backward(loss)
        for o in opts:
            o.step()
            o.zero_grad()


def main():
    fabric = Fabric(accelerator="cpu", devices=2, strategy="ddp")
    fabric.launch()
    fabric.seed_everything(21)
    model, ob, oh = build(fabric)
    run_steps(fabric, model, (ob, oh), 0, STEPS_BEFORE_SAVE)
    fabric.save(CKPT, {"model": model, "opt_body": ob, "opt_head": oh, "step": STEPS_BEFORE_SAVE})
    del model, ob, oh

    fabric.seed_everything(999)  # fresh objects get different init; the checkpoint overwrites it
    model, ob, oh = build(fabric)
    state = {"model": model, "opt_body": ob, "opt_head": oh, "step": 0}
    fabric.load(CKPT, state)
    run_steps(fabric, model, (ob, oh), state["step"], TOTAL_STEPS)

    if fabric.global_rank == 0:
        h = hashlib.sha256()
        for _, p in model.module.named_parameters():
            h.update(p.detach().float().contiguous().cpu().numpy().tobytes())
        print("FINAL_SHA256", h.hexdigest(), flush=True)
    fabric.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
