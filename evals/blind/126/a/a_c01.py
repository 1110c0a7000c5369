"""Tabular classifier on DeepSpeed ZeRO-3 with accumulation driven by the loop.

The DeepSpeed config keeps gradient_accumulation_steps at 1; the trainer groups
micro-batches into windows itself (3-3-2 per epoch), scales each loss by the
window's length and calls engine.step() once per window.  Clipping at 0.5 is
applied by the engine on the accumulated gradient.  Two ranks via torchrun.
"""
import argparse
import hashlib

import deepspeed
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F


def get_args():
    p = argparse.ArgumentParser()
    p.add_argument("--features", type=int, default=20)
    p.add_argument("--classes", type=int, default=6)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--micro-bs", type=int, default=8)
    p.add_argument("--micro-per-epoch", type=int, default=8)
    p.add_argument("--window", type=int, default=3)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--lr", type=float, default=0.3)
    p.add_argument("--clip", type=float, default=0.5)
    p.add_argument("--seed", type=int, default=11)
    return p.parse_args()


class TabularNet(nn.Module):
    def __init__(self, a):
        super().__init__()
        self.inp = nn.Linear(a.features, a.hidden)
        self.norm = nn.LayerNorm(a.hidden)
        self.hid = nn.Linear(a.hidden, a.hidden)
        self.out = nn.Linear(a.hidden, a.classes)

    def forward(self, x):
        h = F.gelu(self.norm(self.inp(x)))
        return self.out(F.gelu(self.hid(h)) + h)


def epoch_batches(a, rank, epoch):
    g = torch.Generator().manual_seed(a.seed + 100 * epoch + rank)
    proj = torch.randn(a.features, a.classes, generator=torch.Generator().manual_seed(a.seed))
    out = []
    for _ in range(a.micro_per_epoch):
        x = torch.randn(a.micro_bs, a.features, generator=g)
        y = (x @ proj + 0.5 * torch.randn(a.micro_bs, a.classes, generator=g)).argmax(-1)
        out.append((x, y))
    return out


class WindowedZeroTrainer:
    def __init__(self, a):
        self.a = a
        deepspeed.init_distributed(dist_backend="gloo")
        self.rank = dist.get_rank()
        torch.manual_seed(a.seed)
        model = TabularNet(a)
        opt = torch.optim.SGD(model.parameters(), lr=a.lr, momentum=0.0)
        config = {
            "train_micro_batch_size_per_gpu": a.micro_bs,
            "gradient_accumulation_steps": 1,
            "gradient_clipping": a.clip,
            "zero_optimization": {"stage": 3},
            "zero_allow_untested_optimizer": True,
            "steps_per_print": 10_000,
        }
        self.engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, config=config)

    def windows(self, batches):
        for s in range(0, len(batches), self.a.window):
            yield batches[s:s + self.a.window]

    def run_window(self, window):
        total = 0.0
        for x, y in window:
            loss = F.cross_entropy(self.engine(x), y) / len(window)
            self.engine.backward(loss)
            total += loss.item()
        self.engine.step()
        return total

    def fit(self):
        for epoch in range(self.a.epochs):
            for w, window in enumerate(self.windows(epoch_batches(self.a, self.rank, epoch))):
                loss = self.run_window(window)
                if self.rank == 0:
                    print(f"epoch {epoch} window {w} size {len(window)} loss {loss:.4f}")

    def sha(self):
        params = [p for _, p in self.engine.module.named_parameters()]
        h = hashlib.sha256()
        with deepspeed.zero.GatheredParameters(params, modifier_rank=None):
            for p in params:
                h.update(p.detach().float().contiguous().numpy().tobytes())
        return h.hexdigest()


if __name__ == "__main__":
    trainer = WindowedZeroTrainer(get_args())
    trainer.fit()
    digest = trainer.sha()
    if trainer.rank == 0:
        print(f"FINAL_SHA256 {digest}")
    dist.barrier()
