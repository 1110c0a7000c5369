"""modded-nanoGPT-style training: Muon for the hidden matrices, AdamW for the rest.

Two ranks spawned with mp.spawn, DDP with no_sync between window boundaries, a frozen
positional table, a trapezoidal LR schedule shared by both optimizers and Muon momentum
warm-up. An epoch has 10 micro-batches per rank and K = 4, so every epoch ends with a
window of 2 micro-batches whose loss is averaged over those 2.
"""
import argparse
import hashlib
import math
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

WORLD = 2


class Hyper:
    seed = 2024
    vocab = 80
    seq_len = 32
    n_seq = 80
    dim = 64
    n_layer = 2
    n_head = 4
    micro_bs = 4
    accum = 4
    epochs = 6
    adam_lr = 6e-3
    muon_lr = 0.03
    cooldown_frac = 0.4


# ----------------------------------------------------------------------------- Muon
def zeropower_via_newtonschulz5(G, steps=5):
    a, b, c = (3.4445, -4.7750, 2.0315)
    X = G.float()
    if G.size(0) > G.size(1):
        X = X.T
    X = X / (X.norm() + 1e-7)
    for _ in range(steps):
        A = X @ X.T
        B = b * A + c * A @ A
        X = a * X + B @ X
    if G.size(0) > G.size(1):
        X = X.T
    return X


class Muon(torch.optim.Optimizer):
    def __init__(self, params, lr=0.02, momentum=0.95, nesterov=True, ns_steps=5):
        super().__init__(params, dict(lr=lr, momentum=momentum, nesterov=nesterov,
                                      ns_steps=ns_steps))

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if "momentum_buffer" not in state:
                    state["momentum_buffer"] = torch.zeros_like(p)
                buf = state["momentum_buffer"]
                buf.lerp_(p.grad, 1 - group["momentum"])
                g = p.grad.lerp(buf, group["momentum"]) if group["nesterov"] else buf
                g = zeropower_via_newtonschulz5(g, steps=group["ns_steps"])
                p.add_(g, alpha=-group["lr"] * max(1, p.size(-2) / p.size(-1)) ** 0.5)


# ----------------------------------------------------------------------------- model
class Block(nn.Module):
    def __init__(self, dim, n_head):
        super().__init__()
        self.n_head = n_head
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.proj = nn.Linear(dim, dim, bias=False)
        self.fc = nn.Linear(dim, 4 * dim, bias=False)
        self.fc_out = nn.Linear(4 * dim, dim, bias=False)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(F.rms_norm(x, (C,))).view(B, T, 3, self.n_head, -1).unbind(2)
        q, k = F.rms_norm(q, (q.size(-1),)), F.rms_norm(k, (k.size(-1),))
        y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                           v.transpose(1, 2), is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(B, T, C))
        return x + self.fc_out(F.relu(self.fc(F.rms_norm(x, (C,)))).square())


class TinyGPT(nn.Module):
    def __init__(self, h):
        super().__init__()
        self.embed = nn.Embedding(h.vocab, h.dim)
        pos = torch.arange(h.seq_len)[:, None] / (10000 ** (torch.arange(0, h.dim, 2) / h.dim))
        table = torch.zeros(h.seq_len, h.dim)
        table[:, 0::2], table[:, 1::2] = torch.sin(pos), torch.cos(pos)
        self.pos = nn.Parameter(table * 0.1, requires_grad=False)
        self.blocks = nn.ModuleList([Block(h.dim, h.n_head) for _ in range(h.n_layer)])
        self.lm_head = nn.Linear(h.dim, h.vocab, bias=False)
        nn.init.zeros_(self.lm_head.weight)

    def forward(self, idx, targets):
        x = self.embed(idx) + self.pos[: idx.size(1)]
        for b in self.blocks:
            x = b(x)
        logits = self.lm_head(F.rms_norm(x, (x.size(-1),)))
        logits = 15 * torch.tanh(logits / 15)
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def synthetic_corpus(h):
    g = torch.Generator().manual_seed(h.seed)
    # sequences that repeat a random motif with noise
    motifs = torch.randint(0, h.vocab, (h.n_seq, 5), generator=g)
    seq = motifs.repeat(1, (h.seq_len + 1) // 5 + 1)[:, : h.seq_len + 1]
    noise = torch.rand(seq.shape, generator=g) < 0.15
    seq = torch.where(noise, torch.randint(0, h.vocab, seq.shape, generator=g), seq)
    return TensorDataset(seq[:, :-1].contiguous(), seq[:, 1:].contiguous())


def lr_mult(step, total, cooldown_frac):
    x = step / total
    return 1.0 if x < 1 - cooldown_frac else (1 - x) / cooldown_frac


def run(rank, port):
    h = Hyper
    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    torch.manual_seed(h.seed)

    ds = synthetic_corpus(h)
    sampler = DistributedSampler(ds, num_replicas=WORLD, rank=rank, shuffle=True, seed=h.seed)
    loader = DataLoader(ds, batch_size=h.micro_bs, sampler=sampler)
    n_micro = len(loader)                          # 10 per rank
    windows_per_epoch = math.ceil(n_micro / h.accum)
    total_steps = windows_per_epoch * h.epochs

    raw = TinyGPT(h)
    model = DDP(raw)
    hidden = [p for n, p in raw.blocks.named_parameters() if p.ndim == 2]
    other = [raw.embed.weight, raw.lm_head.weight]
    adam = torch.optim.AdamW(other, lr=h.adam_lr, betas=(0.8, 0.95), weight_decay=0.0)
    muon = Muon(hidden, lr=h.muon_lr, momentum=0.95)
    optimizers = [adam, muon]
    for opt in optimizers:
        for g in opt.param_groups:
            g["initial_lr"] = g["lr"]

    step = 0
    for epoch in range(h.epochs):
        sampler.set_epoch(epoch)
        for i, (x, y) in enumerate(loader):
            win_start = (i // h.accum) * h.accum
            win_len = min(h.accum, n_micro - win_start)
            boundary = i == win_start + win_len - 1
            if boundary:
                loss = model(x, y) / win_len
                loss.backward()
            else:
                with model.no_sync():
                    loss = model(x, y) / win_len
                    loss.backward()
            if not boundary:
                continue

            mult = lr_mult(step, total_steps, h.cooldown_frac)
            for opt in optimizers:
                for g in opt.param_groups:
                    g["lr"] = g["initial_lr"] * mult
            frac = min(step / 10, 1)
            for g in muon.param_groups:
                g["momentum"] = (1 - frac) * 0.85 + frac * 0.95
            for opt in optimizers:
                opt.step()
            model.zero_grad(set_to_none=True)
            step += 1
            if rank == 0 and step % 6 == 0:
                print(f"step {step}/{total_steps} loss {loss.item() * win_len:.4f} mult {mult:.2f}")

    if rank == 0:
        hsh = hashlib.sha256()
        for _, p in raw.named_parameters():
            hsh.update(p.detach().float().contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {hsh.hexdigest()}")
    dist.destroy_process_group()


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, default=33221)
    args = ap.parse_args()
    mp.spawn(run, args=(args.port,), nprocs=WORLD, join=True)
