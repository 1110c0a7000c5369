"""ZeRO-2 regression fine-tune with coalesced gradient reduction.

The DeepSpeed engine owns gradient accumulation (GA from the config).  To cut
the number of reduce-scatters, every micro-step's backward runs inside
``engine.coalesce_grad_reduction()`` so the per-parameter hooks are skipped and
one flush reduces the whole gradient.
"""
import hashlib
import os

import deepspeed
import torch
import torch.nn as nn
import torch.nn.functional as F

MICRO_BS = 4
GA = 4
STEPS = 12
LR = 3e-3


class Regressor(nn.Module):
    def __init__(self, d_in=16, d_hid=64, d_out=4):
        super().__init__()
        self.inp = nn.Linear(d_in, d_hid)
        self.blocks = nn.ModuleList([nn.Linear(d_hid, d_hid) for _ in range(2)])
        self.out = nn.Linear(d_hid, d_out)

    def forward(self, x):
        h = torch.tanh(self.inp(x))
        for blk in self.blocks:
            h = h + torch.tanh(blk(h))
        return self.out(h)


def ds_config(world):
    return {
        "train_micro_batch_size_per_gpu": MICRO_BS,
        "gradient_accumulation_steps": GA,
        "train_batch_size": MICRO_BS * GA * world,
        "gradient_clipping": 0.0,
        "zero_optimization": {"stage": 2, "overlap_comm": False, "contiguous_gradients": True},
        "steps_per_print": 10_000,
        "wall_clock_breakdown": False,
    }


def make_data(rank, n_micro):
    g = torch.Generator().manual_seed(1234)
    w_true = torch.randn(16, 4, generator=g)
    xs = torch.randn(2, n_micro, MICRO_BS, 16, generator=g)
    ys = xs @ w_true + 0.1 * torch.randn(2, n_micro, MICRO_BS, 4, generator=g)
    return list(zip(xs[rank], ys[rank]))


def run_window(engine, window):
    """K micro-batches, one flush, then K engine.step() calls (the engine's
    micro-step counter decides which one updates)."""
    losses = []
    with engine.coalesce_grad_reduction():
        for x, y in window:
            loss = F.mse_loss(engine(x), y)
            engine.backward(loss)
            losses.append(loss.detach())
    for _ in window:
        engine.step()
    return torch.stack(losses).mean()


def main():
    deepspeed.init_distributed(dist_backend="gloo")
    rank = torch.distributed.get_rank()
    world = torch.distributed.get_world_size()
    torch.manual_seed(0)
    model = Regressor()
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.01)
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, config=ds_config(world))

    data = make_data(rank, STEPS * GA)
    for w in range(STEPS):
        loss = run_window(engine, data[w * GA:(w + 1) * GA])
        if rank == 0 and engine.global_steps % 4 == 0:
            print(f"step {engine.global_steps} loss {loss.item():.4f}", flush=True)

    h = hashlib.sha256()
    for _, p in engine.module.named_parameters():
        h.update(p.detach().float().contiguous().numpy().tobytes())
    if rank == 0:
        print("FINAL_SHA256", h.hexdigest(), flush=True)
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
