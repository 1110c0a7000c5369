"""DDP classifier (torchrun, 2 ranks) with fp16 autocast and one GradScaler shared by two
optimizers (AdamW for the encoder, SGD for the classifier), a frozen feature table,
clipping after both optimizers are unscaled, and a preemption in the middle of an
accumulation window: each rank checkpoints its partially accumulated (not yet
reduced) gradients together with the model, optimizers, scaler and counters, and the
run resumes into freshly built DDP / optimizer / scaler objects.
"""
import contextlib
import hashlib
import os
from types import SimpleNamespace

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

HERE = os.path.dirname(os.path.abspath(__file__))
CFG = SimpleNamespace(K=3, micro_bs=8, total_micro=27, preempt_after_micro=13,
                      lr_enc=2e-3, lr_cls=3e-2, clip=0.7, seed=31, n_cls=5)


class Clf(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.features = nn.Linear(20, 32)          # frozen random feature table
        self.features.requires_grad_(False)
        self.encoder = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU())
        self.classifier = nn.Linear(64, cfg.n_cls)

    def forward(self, x):
        return self.classifier(self.encoder(torch.tanh(self.features(x))))


def dataset(cfg, world):
    g = torch.Generator().manual_seed(cfg.seed + 5)
    n = cfg.total_micro * cfg.micro_bs * world
    x = torch.randn(n, 20, generator=g)
    y = (x[:, :cfg.n_cls] + 0.3 * x[:, cfg.n_cls:2 * cfg.n_cls]).argmax(1)
    return x, y


class Run:
    def __init__(self, cfg, rank, world):
        self.cfg, self.rank, self.world = cfg, rank, world
        self.x, self.y = dataset(cfg, world)
        self.ckpt = os.path.join(HERE, "tmp_scratch", f"{os.path.basename(__file__)}.rank{rank}.ckpt")
        self.build()

    def build(self):
        torch.manual_seed(self.cfg.seed)
        self.net = Clf(self.cfg)
        self.ddp = DDP(self.net)
        self.opt_enc = torch.optim.AdamW(self.net.encoder.parameters(), lr=self.cfg.lr_enc)
        self.opt_cls = torch.optim.SGD(self.net.classifier.parameters(), lr=self.cfg.lr_cls, momentum=0.9)
        self.scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 12)
        self.micro = 0

    def save(self):
        grads = {n: (p.grad.clone() if p.grad is not None else None) for n, p in self.net.named_parameters()}
        torch.save({"model": self.net.state_dict(), "opt_enc": self.opt_enc.state_dict(),
                    "opt_cls": self.opt_cls.state_dict(), "scaler": self.scaler.state_dict(),
                    "micro": self.micro, "grads": grads}, self.ckpt)

    def load(self):
        state = torch.load(self.ckpt, weights_only=False)
        self.build()
        self.net.load_state_dict(state["model"])
        self.opt_enc.load_state_dict(state["opt_enc"])
        self.opt_cls.load_state_dict(state["opt_cls"])
        self.scaler.load_state_dict(state["scaler"])
        self.micro = state["micro"]
        for n, p in self.net.named_parameters():
            if state["grads"][n] is not None:
                p.grad = state["grads"][n]
        os.remove(self.ckpt)

    def micro_batch(self, i):
        b = self.cfg.micro_bs
        lo = (i * self.world + self.rank) * b
        return self.x[lo: lo + b], self.y[lo: lo + b]

    def run_until(self, stop):
        K = self.cfg.K
        while self.micro < stop:
            boundary = (self.micro + 1) % K == 0
            x, y = self.micro_batch(self.micro)
            with (contextlib.nullcontext() if boundary else self.ddp.no_sync()):
                with torch.autocast("cpu", dtype=torch.float16):
                    logits = self.ddp(x)
                loss = F.cross_entropy(logits.float(), y)
                self.scaler.scale(loss / K).backward()
            self.micro += 1
            if boundary:
                self.scaler.unscale_(self.opt_enc)
                self.scaler.unscale_(self.opt_cls)
                torch.nn.utils.clip_grad_norm_(
                    [p for p in self.net.parameters() if p.requires_grad], self.cfg.clip)
                self.scaler.step(self.opt_enc)
                self.scaler.step(self.opt_cls)
                self.scaler.update()
                self.opt_enc.zero_grad(set_to_none=True)
                self.opt_cls.zero_grad(set_to_none=True)


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    run = Run(CFG, rank, world)
    run.run_until(CFG.preempt_after_micro)      # stops one micro-batch into a window
    run.save()
    dist.barrier()
    run.load()                                  # new DDP, optimizers, scaler
    run.run_until(CFG.total_micro)
    h = hashlib.sha256()
    for _, p in run.net.named_parameters():
        h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
    if rank == 0:
        print(f"FINAL_SHA256 {h.hexdigest()}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
