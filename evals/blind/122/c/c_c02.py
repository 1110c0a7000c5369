"""Offline advantage-weighted actor-critic on Lightning Fabric.

Actor and critic are separate Fabric modules with their own optimizers (Adam and
SGD-momentum). Each rank's epoch has 8 equal micro-batches and K = 3, so windows
are 3-3-2; every window is averaged over its own length. The run is preempted
after the first epoch, rebuilt from scratch and resumed from fabric.save/load."""
import contextlib
import hashlib
import os
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
from lightning_fabric import Fabric, seed_everything


@dataclass
class Cfg:
    obs: int = 12
    act: int = 4
    micro_bs: int = 5
    micro_per_epoch: int = 8
    accum: int = 3
    epochs: int = 3
    gamma: float = 0.9
    awr_beta: float = 1.0
    ckpt: str = "tmp_scratch/c_c02_state.ckpt"


def transitions(cfg, epoch, rank):
    g = torch.Generator().manual_seed(500 + 17 * epoch + rank)
    n = cfg.micro_bs * cfg.micro_per_epoch
    s = torch.randn(n, cfg.obs, generator=g)
    a = torch.randint(0, cfg.act, (n,), generator=g)
    r = torch.randn(n, generator=g)
    s2 = torch.randn(n, cfg.obs, generator=g)
    return list(zip(*(t.split(cfg.micro_bs) for t in (s, a, r, s2))))


def build(fabric, cfg):
    torch.manual_seed(3)
    actor = nn.Sequential(nn.Linear(cfg.obs, 32), nn.Tanh(), nn.Linear(32, cfg.act))
    critic = nn.Sequential(nn.Linear(cfg.obs, 32), nn.Tanh(), nn.Linear(32, 1))
    a_opt = torch.optim.Adam(actor.parameters(), lr=3e-3)
    c_opt = torch.optim.SGD(critic.parameters(), lr=0.02, momentum=0.9)
    actor, a_opt = fabric.setup(actor, a_opt)
    critic, c_opt = fabric.setup(critic, c_opt)
    return actor, critic, a_opt, c_opt


def run_epoch(fabric, cfg, epoch, actor, critic, a_opt, c_opt):
    micro = transitions(cfg, epoch, fabric.global_rank)
    for w0 in range(0, len(micro), cfg.accum):
        window = micro[w0:w0 + cfg.accum]
        for j, (s, a, r, s2) in enumerate(window):
            syncing = j == len(window) - 1
            with contextlib.ExitStack() as stack:
                stack.enter_context(fabric.no_backward_sync(actor, enabled=not syncing))
                stack.enter_context(fabric.no_backward_sync(critic, enabled=not syncing))
                v = critic(s).squeeze(-1)
                with torch.no_grad():
                    target = r + cfg.gamma * critic(s2).squeeze(-1)
                    adv = target - v
                    w = torch.clamp(torch.exp(adv / cfg.awr_beta), max=20.0)
                logp = F.log_softmax(actor(s), -1).gather(1, a[:, None]).squeeze(1)
                actor_loss = -(w * logp).mean()
                critic_loss = F.mse_loss(v, target)
                fabric.backward((actor_loss + 0.5 * critic_loss) / len(window))
        fabric.clip_gradients(actor, a_opt, max_norm=0.1)
        a_opt.step()
        c_opt.step()
        a_opt.zero_grad()
        c_opt.zero_grad()


def main():
    cfg = Cfg()
    fabric = Fabric(accelerator="cpu", devices=2, strategy="ddp")
    fabric.launch()
    seed_everything(0)
    os.makedirs("tmp_scratch", exist_ok=True)

    actor, critic, a_opt, c_opt = build(fabric, cfg)
    run_epoch(fabric, cfg, 0, actor, critic, a_opt, c_opt)
    fabric.save(cfg.ckpt, {"actor": actor, "critic": critic, "a_opt": a_opt, "c_opt": c_opt, "epoch": 1})
    fabric.barrier()
    del actor, critic, a_opt, c_opt

    # "preempted": rebuild everything and resume
    actor, critic, a_opt, c_opt = build(fabric, cfg)
    state = {"actor": actor, "critic": critic, "a_opt": a_opt, "c_opt": c_opt, "epoch": 0}
    fabric.load(cfg.ckpt, state)
    for epoch in range(state["epoch"], cfg.epochs):
        run_epoch(fabric, cfg, epoch, actor, critic, a_opt, c_opt)

    if fabric.global_rank == 0:
        h = hashlib.sha256()
        for mod in (actor, critic):
            for _, p in mod.module.named_parameters():
                h.update(p.detach().float().contiguous().numpy().tobytes())
        print("FINAL_SHA256", h.hexdigest(), flush=True)


if __name__ == "__main__":
    main()
