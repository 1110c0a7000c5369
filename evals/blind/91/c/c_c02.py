"""DDPM-style denoiser on 2 spawned ranks (gloo), flat-buffer gradient all-reduce by hand.

- two optimizers: AdamW for the denoiser, SGD+momentum for the learned time embedding
- a frozen random Fourier projection (nn.Parameter, requires_grad=False)
- a checkpoint after update 6; training resumes into freshly built objects
- K = 3 micro-batches per rank, eps-prediction MSE averaged over the window
"""
import hashlib
import math
import os
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F

WORLD = 2
PORT = 43251
K = 3
MICRO_BS = 16
UPDATES = 14
CKPT_AT = 6
T_STEPS = 50


class Denoiser(nn.Module):
    def __init__(self, d=2, h=48, n_freq=8):
        super().__init__()
        self.fourier = nn.Parameter(torch.randn(1, n_freq) * 4.0, requires_grad=False)
        self.t_embed = nn.Sequential(nn.Linear(2 * n_freq, h), nn.SiLU())
        self.net = nn.Sequential(nn.Linear(d + h, h), nn.SiLU(), nn.Linear(h, h), nn.SiLU(), nn.Linear(h, d))

    def forward(self, x, t):
        ang = t[:, None] * self.fourier
        emb = self.t_embed(torch.cat([ang.sin(), ang.cos()], -1))
        return self.net(torch.cat([x, emb], -1))


def build(seed=0):
    torch.manual_seed(seed)
    model = Denoiser()
    opt_net = torch.optim.AdamW(model.net.parameters(), lr=2e-3, weight_decay=0.01)
    opt_t = torch.optim.SGD(model.t_embed.parameters(), lr=5e-2, momentum=0.9)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt_net, T_max=UPDATES)
    return model, opt_net, opt_t, sched


betas = torch.linspace(1e-4, 0.05, T_STEPS)
alphas_bar = torch.cumprod(1 - betas, 0)


def micro_batch(rank, update, k):
    g = torch.Generator().manual_seed(10_000 * update + 100 * k + rank)
    x0 = torch.randn(MICRO_BS, 2, generator=g) * torch.tensor([1.0, 0.3]) + torch.tensor([0.5, -1.0])
    t = torch.randint(0, T_STEPS, (MICRO_BS,), generator=g)
    eps = torch.randn(MICRO_BS, 2, generator=g)
    return x0, t, eps


def allreduce_grads_flat(params):
    grads = [p.grad for p in params if p.grad is not None]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    flat.div_(WORLD)
    off = 0
    for g in grads:
        n = g.numel()
        g.copy_(flat[off:off + n].view_as(g))
        off += n


def train_updates(rank, model, opt_net, opt_t, sched, start, stop):
    trainable = [p for p in model.parameters() if p.requires_grad]
    for update in range(start, stop):
        opt_net.zero_grad(set_to_none=True)
        opt_t.zero_grad(set_to_none=True)
        for k in range(K):
            x0, t, eps = micro_batch(rank, update, k)
            ab = alphas_bar[t][:, None]
            xt = ab.sqrt() * x0 + (1 - ab).sqrt() * eps
            loss = F.mse_loss(model(xt, t.float() / T_STEPS), eps)
            (loss / K).backward()
        allreduce_grads_flat(trainable)
        opt_net.step()
        opt_t.step()
        sched.step()


def params_sha256(module):
    h = hashlib.sha256()
    for _, p in module.named_parameters():
        h.update(p.detach().to(torch.float32).contiguous().cpu().numpy().tobytes())
    return h.hexdigest()


def worker(rank, ckpt_path):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(PORT)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    torch.set_num_threads(1)

    model, opt_net, opt_t, sched = build()
    train_updates(rank, model, opt_net, opt_t, sched, 0, CKPT_AT)
    if rank == 0:
        torch.save({"model": model.state_dict(), "opt_net": opt_net.state_dict(), "opt_t": opt_t.state_dict(),
                    "sched": sched.state_dict(), "update": CKPT_AT}, ckpt_path)
    dist.barrier()
    del model, opt_net, opt_t, sched

    # ---- resume into new objects (different init seed: everything comes from the file)
    model, opt_net, opt_t, sched = build(seed=123)
    state = torch.load(ckpt_path, weights_only=True)
    model.load_state_dict(state["model"])
    opt_net.load_state_dict(state["opt_net"])
    opt_t.load_state_dict(state["opt_t"])
    sched.load_state_dict(state["sched"])
    train_updates(rank, model, opt_net, opt_t, sched, state["update"], UPDATES)

    if rank == 0:
        print(f"FINAL_SHA256 {params_sha256(model)}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as d:
        mp.spawn(worker, args=(os.path.join(d, "ckpt.pt"),), nprocs=WORLD, join=True)
