"""Multi-task DDP trainer: shared backbone, task-specific heads.

Config from argparse; the trainer owns the accumulation loop (K micro-batches per
optimizer step, DDP gradient sync only on the last micro-batch of a window).
"""
import argparse
import contextlib
import hashlib

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP


def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("--d-in", type=int, default=20)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--n-classes", type=int, default=5)
    p.add_argument("--micro-batch", type=int, default=6)
    p.add_argument("--grad-accum", type=int, default=3)
    p.add_argument("--steps", type=int, default=15)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--dump", default=None)
    return p.parse_args()


class Backbone(nn.Module):
    def __init__(self, d_in, hidden):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(d_in, hidden), nn.Tanh(),
            nn.Linear(hidden, hidden), nn.Tanh(),
        )

    def forward(self, x):
        return self.net(x)


class MultiTaskNet(nn.Module):
    def __init__(self, d_in, hidden, n_classes):
        super().__init__()
        self.backbone = Backbone(d_in, hidden)
        self.cls_head = nn.Linear(hidden, n_classes)
        self.reg_head = nn.Linear(hidden, 1)

    def forward(self, x):
        h = self.backbone(x)
        return self.cls_head(h), self.reg_head(h).squeeze(-1)


class MultiTaskTrainer:
    def __init__(self, args):
        self.args = args
        self.rank = dist.get_rank()
        self.world = dist.get_world_size()
        torch.manual_seed(args.seed)
        self.net = MultiTaskNet(args.d_in, args.hidden, args.n_classes)
        self.model = self.wrap(self.net)
        self.optimizer = torch.optim.Adam(self.net.parameters(), lr=args.lr)
        self.make_data()

    def wrap(self, net):
        # heads are small and get swapped between tasks; keep DDP on the shared trunk
        net.backbone = DDP(net.backbone)
        self.sync_owner = net.backbone
        return net

    def make_data(self):
        a = self.args
        g = torch.Generator().manual_seed(a.seed + 100)
        n = a.steps * a.grad_accum * a.micro_batch * self.world
        self.x = torch.randn(n, a.d_in, generator=g)
        wc = torch.randn(a.d_in, a.n_classes, generator=g)
        wr = torch.randn(a.d_in, generator=g)
        self.y_cls = (self.x @ wc).argmax(-1)
        self.y_reg = torch.sin(self.x @ wr) + 0.1 * torch.randn(n, generator=g)

    def batch(self, micro_step):
        a = self.args
        start = (micro_step * self.world + self.rank) * a.micro_batch
        sl = slice(start, start + a.micro_batch)
        return self.x[sl], self.y_cls[sl], self.y_reg[sl]

    def compute_loss(self, x, y_cls, y_reg):
        logits, pred = self.model(x)
        return F.cross_entropy(logits, y_cls) + 0.5 * F.mse_loss(pred, y_reg)

    def train(self):
        a = self.args
        for step in range(a.steps):
            for k in range(a.grad_accum):
                last = k == a.grad_accum - 1
                ctx = contextlib.nullcontext() if last else self.sync_owner.no_sync()
                with ctx:
                    loss = self.compute_loss(*self.batch(step * a.grad_accum + k))
                    (loss / a.grad_accum).backward()
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)

    def digest(self):
        h = hashlib.sha256()
        flat = []
        for _, p in self.net.named_parameters():
            t = p.detach().to(torch.float32).contiguous()
            h.update(t.numpy().tobytes())
            flat.append(t.reshape(-1))
        return h.hexdigest(), torch.cat(flat)


def main():
    args = parse_args()
    dist.init_process_group("gloo")
    torch.use_deterministic_algorithms(True)
    trainer = MultiTaskTrainer(args)
    trainer.train()
    digest, flat = trainer.digest()
    if dist.get_rank() == 0:
        if args.dump:
            torch.save(flat, args.dump)
        print(f"FINAL_SHA256 {digest}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
