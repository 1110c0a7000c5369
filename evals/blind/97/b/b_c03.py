"""DDP regression trainer with a frozen stem, two optimizers (AdamW for the body,
SGD for the head), bucket-view gradients, and a restart from a checkpoint into
rebuilt objects halfway through.

Accumulation: the loss is computed first, then only the backward is wrapped in
`no_sync()` on the non-final micro-batches (the forward/loss helper is shared
with evaluation code and knows nothing about DDP).
"""
import contextlib
import hashlib
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

ACCUM = 3
MICRO = 5
TOTAL_STEPS = 10
RESTART_AT = 6
SEED = 77
HERE = os.path.dirname(os.path.abspath(__file__))
CKPT = os.path.join(HERE, "tmp_scratch", "c03_ckpt.pt")


class Regressor(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Linear(16, 32)
        self.body = nn.Sequential(nn.Linear(32, 32), nn.SiLU(), nn.Linear(32, 32), nn.SiLU())
        self.head = nn.Linear(32, 2)

    def forward(self, x):
        return self.head(self.body(torch.tanh(self.stem(x))))


def micro_batch(rank, step, micro):
    g = torch.Generator().manual_seed(SEED + 10000 * rank + 100 * step + micro)
    x = torch.randn(MICRO, 16, generator=g)
    y = torch.stack([x[:, :4].sum(1), (x[:, 4:8] ** 2).mean(1)], dim=1)
    return x, y


def loss_fn(model, x, y):
    return F.smooth_l1_loss(model(x), y)


def build():
    torch.manual_seed(SEED)
    net = Regressor()
    for p in net.stem.parameters():
        p.requires_grad_(False)
    model = DDP(net, gradient_as_bucket_view=True)
    opt_body = torch.optim.AdamW(net.body.parameters(), lr=2e-3, weight_decay=0.01)
    opt_head = torch.optim.SGD(net.head.parameters(), lr=5e-2, momentum=0.9)
    return model, [opt_body, opt_head]


def train_steps(model, opts, start, stop):
    rank = dist.get_rank()
    for step in range(start, stop):
        for m in range(ACCUM):
            x, y = micro_batch(rank, step, m)
            loss = loss_fn(model, x, y) / ACCUM
            ctx = model.no_sync() if m < ACCUM - 1 else contextlib.nullcontext()
            with ctx:
                loss.backward()
        for o in opts:
            o.step()
        for o in opts:
            o.zero_grad(set_to_none=True)


def main():
    dist.init_process_group("gloo")
    torch.use_deterministic_algorithms(True)
    rank = dist.get_rank()

    model, opts = build()
    train_steps(model, opts, 0, RESTART_AT)
    if rank == 0:
        os.makedirs(os.path.dirname(CKPT), exist_ok=True)
        torch.save({"model": model.module.state_dict(),
                    "opts": [o.state_dict() for o in opts],
                    "step": RESTART_AT}, CKPT)
    dist.barrier()
    del model, opts

    model, opts = build()
    state = torch.load(CKPT, weights_only=True)
    model.module.load_state_dict(state["model"])
    for o, s in zip(opts, state["opts"]):
        o.load_state_dict(s)
    train_steps(model, opts, state["step"], TOTAL_STEPS)

    h = hashlib.sha256()
    for _, p in model.module.named_parameters():
        h.update(p.detach().float().contiguous().numpy().tobytes())
    if rank == 0:
        print("FINAL_SHA256", h.hexdigest(), flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
