"""Behaviour cloning + value regression with Lightning Fabric, two modules and two optimizers.

Actor and critic are set up separately in Fabric (each its own DDP wrapper and
optimizer).  Gradients are accumulated over windows of `accum` micro-batches;
the epoch (10 micro-batches per rank) ends in a short window of 2 which is
normalised by its own length.  Both grads are clipped once per window.
"""
import contextlib
import hashlib
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
from lightning_fabric import Fabric
from torch.utils.data import DataLoader, TensorDataset


@dataclass
class Cfg:
    n: int = 80
    obs: int = 16
    acts: int = 6
    batch: int = 4
    accum: int = 4
    epochs: int = 3
    actor_lr: float = 2e-3
    critic_lr: float = 5e-3
    actor_clip: float = 0.2
    critic_clip: float = 1.0
    seed: int = 5


def make_data(cfg):
    g = torch.Generator().manual_seed(11)
    obs = torch.randn(cfg.n, cfg.obs, generator=g)
    expert = (obs @ torch.randn(cfg.obs, cfg.acts, generator=g)).argmax(-1)
    value = torch.tanh(obs @ torch.randn(cfg.obs, generator=g))
    return TensorDataset(obs, expert, value)


def windows(loader, k):
    buf = []
    for b in loader:
        buf.append(b)
        if len(buf) == k:
            yield buf
            buf = []
    if buf:
        yield buf


def main():
    cfg = Cfg()
    fabric = Fabric(accelerator="cpu", devices=2, strategy="ddp")
    fabric.launch()
    fabric.seed_everything(cfg.seed)
    assert fabric.world_size == 2

    agent = nn.ModuleDict({
        "actor": nn.Sequential(nn.Linear(cfg.obs, 48), nn.ReLU(), nn.Linear(48, cfg.acts)),
        "critic": nn.Sequential(nn.Linear(cfg.obs, 48), nn.ReLU(), nn.Linear(48, 1)),
    })
    opt_a = torch.optim.Adam(agent["actor"].parameters(), lr=cfg.actor_lr)
    opt_c = torch.optim.SGD(agent["critic"].parameters(), lr=cfg.critic_lr, momentum=0.9)
    actor, opt_a = fabric.setup(agent["actor"], opt_a)
    critic, opt_c = fabric.setup(agent["critic"], opt_c)

    loader = fabric.setup_dataloaders(
        DataLoader(make_data(cfg), batch_size=cfg.batch, shuffle=True, drop_last=False))

    step = 0
    for epoch in range(cfg.epochs):
        loader.sampler.set_epoch(epoch)
        for window in windows(loader, cfg.accum):
            n_micro = len(window)
            for i, (obs, act, val) in enumerate(window):
                sync = i == n_micro - 1
                with contextlib.ExitStack() as stack:
                    stack.enter_context(fabric.no_backward_sync(actor, enabled=not sync))
                    stack.enter_context(fabric.no_backward_sync(critic, enabled=not sync))
                    bc = F.cross_entropy(actor(obs), act)
                    vl = F.mse_loss(critic(obs).squeeze(-1), val)
                    fabric.backward((bc + vl) / n_micro)
            na = fabric.clip_gradients(actor, opt_a, max_norm=cfg.actor_clip)
            fabric.clip_gradients(critic, opt_c, max_norm=cfg.critic_clip)
            opt_a.step()
            opt_c.step()
            opt_a.zero_grad()
            opt_c.zero_grad()
            step += 1
            if step % 3 == 0:
                fabric.print(f"epoch {epoch} step {step} window {n_micro} actor_norm {float(na):.3f}")

    h = hashlib.sha256()
    for _, p in agent.named_parameters():
        h.update(p.detach().float().contiguous().cpu().numpy().tobytes())
    if fabric.global_rank == 0:
        print(f"FINAL_SHA256 {h.hexdigest()}")


if __name__ == "__main__":
    main()
