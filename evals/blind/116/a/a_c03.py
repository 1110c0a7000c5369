"""ZeRO-2 engine with caller-owned accumulation windows.

The DeepSpeed config says gradient_accumulation_steps = 1; the loop decides the
windows itself.  Each epoch has 8 micro-batches per rank and windows of up to
K = 3 (3-3-2): before every backward the loop tells the engine whether this is
the window's last micro-batch (`set_gradient_accumulation_boundary`), scales the
micro-batch mean by 1/len(window) and calls `engine.step()` once per window.
Two parameter groups (encoder / head) with their own lr and weight decay,
and a clip at 0.5 that acts.
"""
import hashlib

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.distributed as dist
import deepspeed

K, EPOCHS, PER_EPOCH, MB, DIN = 3, 2, 8, 6, 20


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(DIN, 48), nn.SiLU(), nn.Linear(48, 48), nn.SiLU())
        self.head = nn.Linear(48, 3)

    def forward(self, x):
        return self.head(self.encoder(x))


def loader(rank, epoch):
    g = torch.Generator().manual_seed(31 * epoch + rank)
    proj = torch.randn(DIN, 3, generator=torch.Generator().manual_seed(5))
    for _ in range(PER_EPOCH):
        x = torch.randn(MB, DIN, generator=g)
        yield x, (x @ proj).argmax(-1)


def windows(it, k):
    buf = []
    for b in it:
        buf.append(b)
        if len(buf) == k:
            yield buf
            buf = []
    if buf:
        yield buf


def main():
    deepspeed.init_distributed(dist_backend="gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = Net()
    groups = [
        {"params": model.encoder.parameters(), "lr": 2e-3, "weight_decay": 0.1},
        {"params": model.head.parameters(), "lr": 1e-2, "weight_decay": 0.0},
    ]
    opt = torch.optim.AdamW(groups)
    cfg = {
        "train_micro_batch_size_per_gpu": MB,
        "gradient_accumulation_steps": 1,
        "train_batch_size": MB * world,
        "gradient_clipping": 0.5,
        "zero_optimization": {"stage": 2},
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 10_000,
    }
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, config=cfg)

    for epoch in range(EPOCHS):
        for win in windows(loader(rank, epoch), K):
            for m, (x, y) in enumerate(win):
                engine.set_gradient_accumulation_boundary(m == len(win) - 1)
                loss = F.cross_entropy(engine(x), y) / len(win)
                engine.backward(loss)
            engine.step()

    h = hashlib.sha256()
    for _, p in engine.module.named_parameters():
        t = p.detach().float().contiguous()
        h.update(t.numpy().tobytes())
    if rank == 0:
        print("FINAL_SHA256", h.hexdigest(), flush=True)
    dist.barrier()


if __name__ == "__main__":
    main()
