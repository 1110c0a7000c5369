"""Decision-Transformer-style offline RL, 2 ranks via mp.spawn, hand gradient all-reduce.

Trajectories have different lengths; padded steps are masked out of the action loss.
"""
import argparse
import hashlib
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F


def get_args():
    p = argparse.ArgumentParser()
    p.add_argument("--state-dim", type=int, default=11)
    p.add_argument("--act-dim", type=int, default=3)
    p.add_argument("--context", type=int, default=12)
    p.add_argument("--d-model", type=int, default=32)
    p.add_argument("--batch-size", type=int, default=6)
    p.add_argument("--grad-accum", type=int, default=3)
    p.add_argument("--max-iters", type=int, default=10)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--port", type=int, default=49221)
    p.add_argument("--seed", type=int, default=7)
    return p.parse_args()


class TinyDT(nn.Module):
    def __init__(self, a):
        super().__init__()
        self.embed_rtg = nn.Linear(1, a.d_model)
        self.embed_state = nn.Linear(a.state_dim, a.d_model)
        self.embed_t = nn.Embedding(64, a.d_model)
        layer = nn.TransformerEncoderLayer(a.d_model, 4, 2 * a.d_model, dropout=0.0, batch_first=True)
        self.blocks = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.ln = nn.LayerNorm(a.d_model)
        self.predict_action = nn.Sequential(nn.Linear(a.d_model, a.act_dim), nn.Tanh())

    def forward(self, rtg, states, timesteps, pad_mask):
        T = states.shape[1]
        h = self.embed_rtg(rtg) + self.embed_state(states) + self.embed_t(timesteps)
        causal = torch.triu(torch.full((T, T), float("-inf")), 1)
        h = self.blocks(h, mask=causal, src_key_padding_mask=~pad_mask)
        return self.predict_action(self.ln(h))


def make_dataset(a, n):
    g = torch.Generator().manual_seed(a.seed + 100)
    W = torch.randn(a.state_dim, a.act_dim, generator=g) * 0.5
    states = torch.randn(n, a.context, a.state_dim, generator=g)
    actions = torch.tanh(states @ W) + 0.05 * torch.randn(n, a.context, a.act_dim, generator=g)
    rtg = torch.rand(n, a.context, 1, generator=g).flip(1).cumsum(1).flip(1)
    lengths = torch.randint(2, a.context + 1, (n,), generator=g)
    mask = torch.arange(a.context)[None, :] < lengths[:, None]
    timesteps = torch.arange(a.context).expand(n, -1).clone()
    return states, actions, rtg, timesteps, mask


def allreduce_grads(model, world):
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    flat /= world
    off = 0
    for g in grads:
        g.copy_(flat[off: off + g.numel()].view_as(g))
        off += g.numel()


def worker(rank, world, a):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(a.port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(a.seed)
    model = TinyDT(a)
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, weight_decay=1e-4, betas=(0.9, 0.95))
    K, B = a.grad_accum, a.batch_size
    n = a.max_iters * K * world * B
    states, actions, rtg, timesteps, mask = make_dataset(a, n)

    for it in range(a.max_iters):
        # how many action targets this window holds over all ranks (for throughput logging)
        base = it * K * world * B
        win_mask = mask[base: base + K * world * B]
        n_targets = win_mask.sum().float()
        for k in range(K):
            lo = base + (k * world + rank) * B
            sl = slice(lo, lo + B)
            m = mask[sl]
            pred = model(rtg[sl], states[sl], timesteps[sl], m)
            loss = F.mse_loss(pred[m], actions[sl][m])
            (loss / K).backward()
        allreduce_grads(model, world)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.25)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if rank == 0 and it % 3 == 0:
            print(f"iter {it} loss {loss.item():.4f} targets/window {int(n_targets)}", flush=True)

    if rank == 0:
        h = hashlib.sha256()
        for _, p in model.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        print("FINAL_SHA256", h.hexdigest(), flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    args = get_args()
    torch.use_deterministic_algorithms(True)
    mp.spawn(worker, args=(2, args), nprocs=2, join=True)
